"""The SimPy driver: replays a trace through the cost model under any policy.

The driver owns *timing* only. Roles, lifecycles and the legality of commands live in
:class:`~rlsched.cluster.state.ClusterState` (shared with the live driver); engines are
shared-rate decode servers (:mod:`.engine`); the trainer is a FIFO of jobs
(:mod:`.trainer`). SimPy schedules everything with timeouts whose callbacks mutate the
state and then deliver the resulting events to the policy, one at a time, in order.
Runs are deterministic: no wall clock, no global RNG, ties broken by insertion order.
"""

from __future__ import annotations

import random
import time as wallclock
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import simpy

from rlsched.cluster.commands import (
    Command,
    Dispatch,
    Drop,
    Interrupt,
    OptimizerStep,
    Reassign,
    SetTimer,
    SyncWeights,
    Train,
    TrainMicroBatch,
)
from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import PolicyError
from rlsched.cluster.events import (
    EngineIdle,
    Event,
    MicroBatchFinished,
    RolesChanged,
    RunStarted,
    TimerFired,
    TrainStepFinished,
    TrajectoryFinished,
    WeightsSynced,
)
from rlsched.cluster.ids import Drain, GpuState, Role, TrajStatus
from rlsched.cluster.policy import Policy
from rlsched.cluster.record import RunRecorder
from rlsched.cluster.state import ClusterState

from .cost import CostModel
from .engine import EngineSim
from .gpus import GpuStates
from .trainer import MicroBatchJob, OptimizerJob, TrainerSim
from .workload import Batches, Workload

Progress = Callable[[int, int, float], None]  # (steps done, steps, sim time)


@dataclass(slots=True)
class SimTraj:
    """Simulator-side state of one trajectory (its turn data only while in flight)."""

    tid: str
    widx: int  # index in the workload
    n_turns: int
    truncated: bool
    turns: tuple[list[int], list[int], list[float]] | None = None
    ctx: int = 0  # tokens of finished, kept turns
    turns_done_kept: int = 0  # finished, kept turns (mirrors TrajState.turns_done)
    charged: int = -1  # tokens the trainer was charged for (-1: its whole context)
    prompt_kept: int = 0
    output_kept: int = 0
    generated: int = 0  # every output token ever produced (kept + wasted)
    wasted: int = 0
    mid_turn: bool = False  # current turn's prompt is in the context
    turn_progress: int = 0  # tokens of the current turn produced and kept
    turn_version: int = -1
    kv_cached: bool = False
    moved_at: float = -1.0  # KV can be pulled from the engine it left at this time
    env_token: int = 0  # bumps cancel a pending tool-call completion
    join_token: int = 0  # bumps cancel a pending join after a KV transfer
    in_env: bool = False
    sandbox: bool = False
    waiting_sandbox: bool = False


@dataclass
class SimResult:
    state: ClusterState
    makespan: float
    complete: bool
    events_processed: int
    wall_seconds: float
    trajs: dict[str, SimTraj]
    steps: list[dict] = field(default_factory=list)
    gpu_seconds: dict[str, float] = field(default_factory=dict)


class SimDriver:
    def __init__(
        self,
        workload: Workload,
        batches: Batches,
        policy: Policy,
        config: RunConfig,
        cost: CostModel,
        *,
        recorder: RunRecorder | None = None,
        progress: Progress | None = None,
        charge: Callable[[list[str], dict[str, SimTraj]], float] | None = None,
    ) -> None:
        self.w = workload
        self.policy = policy
        self.cfg = config
        self.cost = cost
        self.rec = recorder
        self.progress = progress
        self.env = simpy.Environment()
        self.state = ClusterState(
            config.gpus, config.tp,
            [[(rid, workload.task_ids[workload.index[t]]) for rid, t in b] for b in batches],
            policy.max_staleness,
        )
        self.trajs: dict[str, SimTraj] = {}
        for b in batches:
            for rid, t in b:
                i = workload.index[t]
                self.trajs[rid] = SimTraj(rid, i, int(workload.turns[i]), bool(workload.truncated[i]))
        self.engines: dict[int, EngineSim] = {}
        self.kv_capacity = cost.kv_capacity_tokens(config.tp)
        self.trainer = TrainerSim()
        self.gpus = GpuStates(config.gpus, recorder)
        self.sandbox_free = config.sandbox_slots
        self.sandbox_queue: deque[str] = deque()
        self._events: deque[Event] = deque()
        self._pumping = False
        self.events_processed = 0
        self._done = self.env.event()
        self._steps: list[dict] = []
        self._switch_groups: dict[int, list] = {}
        self._group_seq = 0
        self._charge = charge or self._full_context_flops
        self._engine_switch: dict[int, tuple[int, Role]] = {}

    # ================================================================= run
    def run(self) -> SimResult:
        t0 = wallclock.perf_counter()
        self.policy.reset(self.state, random.Random(self.cfg.seed))
        self._emit(RunStarted())
        self._pump()
        complete = True
        try:
            if not self._done.triggered:
                self.env.run(until=self._done)
        except RuntimeError as exc:
            if "until" not in str(exc) and "No scheduled events" not in str(exc):
                raise
            raise PolicyError(
                f"policy {self.policy.name} stalled at t={self.env.now:.1f}s: nothing is running "
                f"and only {self.state.version} of {self.state.num_steps} steps are done"
            ) from None
        except KeyboardInterrupt:
            complete = False
        now = self.env.now
        self.gpus.close_all(now)
        return SimResult(
            self.state, now, complete, self.events_processed,
            wallclock.perf_counter() - t0, self.trajs, self._steps, dict(self.gpus.busy_seconds),
        )

    # ============================================================== events
    def _emit(self, ev: Event) -> None:
        self._events.append(ev)

    def _pump(self) -> None:
        if self._pumping:
            return
        self._pumping = True
        try:
            st = self.state
            st.advance(self.env.now)
            while self._events:
                ev = self._events.popleft()
                self.events_processed += 1
                self._record_event(ev)
                for cmd in self.policy.on_event(ev, st):
                    st.check(cmd)
                    self._record_command(cmd)
                    self._apply(cmd)
        finally:
            self._pumping = False

    def _later(self, delay: float, fn: Callable[[], None]) -> None:
        ev = self.env.timeout(delay if delay > 0.0 else 0.0)
        ev.callbacks.append(lambda _e: self._run_callback(fn))

    def _run_callback(self, fn: Callable[[], None]) -> None:
        self.events_processed += 1
        self.state.advance(self.env.now)
        fn()
        self._pump()

    def _record_event(self, ev: Event) -> None:
        if self.rec is None:
            return
        now = self.env.now
        match ev:
            case TrajectoryFinished(trajectory=t, status=s, engine=e):
                self.rec.event(now, "TrajectoryFinished", step=self.state.trajs[t].step,
                               engine=e, trajectory=t, detail=s.value)
            case TrainStepFinished(version=v):
                self.rec.event(now, "TrainStepFinished", version=v, step=v - 1)
            case WeightsSynced(engines=es, version=v):
                self.rec.event(now, "WeightsSynced", version=v, detail=_ids(es))
            case RolesChanged(gpus=g, role=r):
                self.rec.event(now, "RolesChanged", detail=f"{r.value} {_ids(g)}")
            case EngineIdle(engine=e):
                self.rec.event(now, "EngineIdle", engine=e)
            case TimerFired(tag=tag):
                self.rec.event(now, "TimerFired", detail=tag)
            case MicroBatchFinished(trajectories=ts):
                self.rec.event(now, "MicroBatchFinished", version=self.state.version, detail=str(len(ts)))
            case _:
                self.rec.event(now, type(ev).__name__)

    def _record_command(self, cmd: Command) -> None:
        if self.rec is None:
            return
        now = self.env.now
        match cmd:
            case Dispatch(trajectories=ts, engine=e):
                self.rec.event(now, "Dispatch", engine=-1 if e is None else e, detail=str(len(ts)))
            case Reassign(gpus=g, role=r, drain=d):
                self.rec.event(now, "Reassign", detail=f"{r.value} {d.value} {_ids(g)}")
            case TrainMicroBatch(trajectories=ts) | Train(trajectories=ts):
                self.rec.event(now, type(cmd).__name__, version=self.state.version, detail=str(len(ts)))
            case _:
                self.rec.event(now, type(cmd).__name__)

    # ============================================================ commands
    def _apply(self, cmd: Command) -> None:
        match cmd:
            case Dispatch(trajectories=tids, engine=e):
                for tid in tids:
                    self._dispatch(tid, e if e is not None else self.state.least_loaded())
            case Reassign(gpus=gpus, role=role, drain=drain):
                self._reassign(gpus, role, drain)
            case TrainMicroBatch(trajectories=tids):
                self._queue_micro_batch(tids)
                self._trainer_next()
            case Train(trajectories=tids):
                self._queue_micro_batch(tids)
                self.trainer.jobs.append(OptimizerJob())
                self.state.queued_optimizer_steps += 1
                self._trainer_next()
            case OptimizerStep():
                self.trainer.jobs.append(OptimizerJob())
                self.state.queued_optimizer_steps += 1
                self._trainer_next()
            case SyncWeights(engines=es):
                self._sync(es if es is not None else self.state.engines())
            case Interrupt(trajectories=tids, keep_progress=keep):
                for tid in tids:
                    self._interrupt(tid, keep)
            case Drop(trajectories=tids):
                for tid in tids:
                    t = self.trajs[tid]
                    t.wasted += t.output_kept
                self.state.mark_dropped(tids)
            case SetTimer(at=at, tag=tag):
                self._later(at - self.env.now, lambda: self._emit(TimerFired(tag)))

    # -------------------------------------------------------- trajectories
    def _dispatch(self, tid: str, e: int) -> None:
        st = self.state
        ts = st.trajs[tid]
        if ts.status is TrajStatus.INTERRUPTED:
            st.mark_resumable(tid)
        st.mark_active(tid, TrajStatus.QUEUED, e)
        t = self.trajs[tid]
        if t.turns is None:
            t.turns = self.w.turn_lists(t.widx)
        self.state.engines_[e].queue.append(tid)
        self._admit(e)

    def _admit(self, e: int) -> None:
        """Start queued trajectories while the engine's KV cache has room (FIFO)."""
        es = self.state.engines_[e]
        eng = self.engines[e]
        while es.queue and not es.draining:
            tid = es.queue[0]
            t = self.trajs[tid]
            need = self._kv_need(t)
            if need > eng.kv_capacity:
                es.queue.popleft()
                self._finish(tid, TrajStatus.TIMED_OUT, e, note="context exceeds KV capacity")
                continue
            if not eng.reserve(tid, need):
                break
            self._drain_evictions(eng)
            es.queue.popleft()
            es.running.add(tid)
            self.state.trajs[tid].status = TrajStatus.RUNNING
            self._start_turn(tid)
        self._engine_touch(e)

    def _kv_need(self, t: SimTraj) -> int:
        """KV tokens the trajectory holds by the end of its current turn."""
        assert t.turns is not None
        i = self.state.trajs[t.tid].turns_done
        return t.ctx + t.turns[0][i] + t.turns[1][i]

    def _drain_evictions(self, eng: EngineSim) -> None:
        for v in eng.evicted:
            self.trajs[v].kv_cached = False
            if self.rec is not None:
                self.rec.event(self.env.now, "Evict", engine=eng.id, trajectory=v)
        eng.evicted.clear()

    def _start_turn(self, tid: str) -> None:
        t = self.trajs[tid]
        ts = self.state.trajs[tid]
        e = ts.engine
        assert e is not None and t.turns is not None
        eng = self.engines[e]
        now = self.env.now
        p = t.turns[0][ts.turns_done]
        delay = 0.0
        if t.kv_cached:
            new, cached = (0 if t.mid_turn else p), t.ctx + (p if t.mid_turn else 0)
        else:
            held = t.ctx + ((p + t.turn_progress) if t.mid_turn else 0)
            if t.moved_at >= 0.0 and held > 0:
                secs, by_prefill = self.cost.migrate_s(self.cfg.tp, held)
                if by_prefill:
                    new, cached = held + (0 if t.mid_turn else p), 0
                else:
                    delay = max(0.0, t.moved_at + secs - now)
                    new, cached = (0 if t.mid_turn else p), held
            else:
                new, cached = held + (0 if t.mid_turn else p), 0
        t.moved_at = -1.0
        t.kv_cached = True
        t.mid_turn = True
        t.turn_version = eng.version
        if delay > 0.0:
            # KV still in transit: the trajectory waits; the engine is not blocked.
            token = t.join_token
            self._later(delay, lambda: self._join_after_prefill(tid, e, new, cached, token))
            return
        self._join_after_prefill(tid, e, new, cached, t.join_token)

    def _join_after_prefill(self, tid: str, e: int, new: int, cached: int, token: int) -> None:
        ts = self.state.trajs[tid]
        t = self.trajs[tid]
        if token != t.join_token or ts.engine != e or ts.status is not TrajStatus.RUNNING:
            return  # moved or interrupted while its KV was in transit
        t = self.trajs[tid]
        assert t.turns is not None
        eng = self.engines[e]
        now = self.env.now
        if new > 0:
            eng.stall(now, self.cost.prefill_s(self.cfg.tp, new, cached))
        o = t.turns[1][ts.turns_done]
        eng.join(now, tid, cached + new, o - t.turn_progress)
        self._engine_touch(e)
        self._wake(eng)

    def _wake(self, eng: EngineSim) -> None:
        at = eng.next_finish(self.env.now)
        if at < eng.wake_at - 1e-9:
            eng.wake_at = at
            self._later(at - self.env.now, lambda: self._on_wake(eng, at))

    def _on_wake(self, eng: EngineSim, at: float) -> None:
        if self.engines.get(eng.id) is not eng:
            return
        if at == eng.wake_at:
            eng.wake_at = float("inf")
        for tid in eng.pop_due(self.env.now):
            self._turn_done(tid, eng)
        if self.engines.get(eng.id) is eng:
            self._wake(eng)
            self._engine_touch(eng.id)

    def _turn_done(self, tid: str, eng: EngineSim) -> None:
        t = self.trajs[tid]
        ts = self.state.trajs[tid]
        assert t.turns is not None
        i = ts.turns_done
        p, o, env_s = t.turns[0][i], t.turns[1][i], t.turns[2][i]
        t.generated += o - t.turn_progress
        t.ctx += p + o
        t.prompt_kept += p
        t.output_kept += o
        t.mid_turn, t.turn_progress = False, 0
        ts.turns_done = t.turns_done_kept = i + 1
        ts.tokens = t.ctx
        v0 = t.turn_version
        ts.min_version = v0 if ts.min_version < 0 else min(ts.min_version, v0)
        ts.max_version = max(ts.max_version, eng.version)
        if i + 1 == t.n_turns:
            es = self.state.engines_[eng.id]
            es.running.discard(tid)
            eng.release(tid)
            status = TrajStatus.TIMED_OUT if t.truncated else TrajStatus.DONE
            self._finish(tid, status, eng.id)
            self._admit(eng.id)
            return
        es = self.state.engines_[eng.id]
        self._env_start(tid, env_s)
        if es.draining:
            self._move_out(tid, eng.id)  # finish_turn drain: leave between turns
        else:
            eng.env_lru[tid] = None

    def _env_start(self, tid: str, env_s: float) -> None:
        t = self.trajs[tid]
        t.in_env = True
        t.env_token += 1
        if self.sandbox_free > 0:
            self.sandbox_free -= 1
            t.sandbox = True
            token = t.env_token
            self._later(env_s, lambda: self._env_done(tid, token))
        else:
            t.waiting_sandbox = True
            self.sandbox_queue.append(tid)
            if self.rec is not None:
                self.rec.event(self.env.now, "SandboxQueued", trajectory=tid)

    def _env_done(self, tid: str, token: int) -> None:
        t = self.trajs[tid]
        if token != t.env_token:
            return
        self._release_sandbox(t)
        t.in_env = False
        ts = self.state.trajs[tid]
        e = ts.engine
        assert e is not None
        if ts.status is TrajStatus.QUEUED:
            # Moved off its engine during tool time: join the queue of its new engine
            # (or of another one if that engine has since left rollout).
            es = self.state.engines_.get(e)
            if es is None or es.draining:
                if not self.state.engines():
                    self._finish(tid, TrajStatus.INTERRUPTED, e, note="no rollout engine left")
                    return
                e = ts.engine = self.state.least_loaded()
            self.state.engines_[e].queue.append(tid)
            self._admit(e)
            return
        eng = self.engines[e]
        eng.env_lru.pop(tid, None)
        need = self._kv_need(t)
        if need > eng.kv_capacity:
            self.state.engines_[e].running.discard(tid)
            eng.release(tid)
            self._finish(tid, TrajStatus.TIMED_OUT, e, note="context exceeds KV capacity")
            self._admit(e)
            return
        if eng.reserve(tid, need):
            self._drain_evictions(eng)
            self._start_turn(tid)
            self._engine_touch(e)
            return
        # No room even after evicting idle contexts: wait at the head of the queue.
        self._drain_evictions(eng)
        eng.release(tid)
        t.kv_cached = False
        es = self.state.engines_[e]
        es.running.discard(tid)
        es.queue.appendleft(tid)
        ts.status = TrajStatus.QUEUED
        self._engine_touch(e)

    def _release_sandbox(self, t: SimTraj) -> None:
        if t.waiting_sandbox:
            t.waiting_sandbox = False
            self.sandbox_queue.remove(t.tid)
        if not t.sandbox:
            return
        t.sandbox = False
        self.sandbox_free += 1
        while self.sandbox_free > 0 and self.sandbox_queue:
            nxt = self.sandbox_queue.popleft()
            u = self.trajs[nxt]
            u.waiting_sandbox = False
            u.sandbox = True
            self.sandbox_free -= 1
            ts = self.state.trajs[nxt]
            env_s = u.turns[2][ts.turns_done - 1] if u.turns is not None else 0.0
            token = u.env_token
            self._later(env_s, lambda n=nxt, k=token: self._env_done(n, k))

    def _finish(self, tid: str, status: TrajStatus, e: int, note: str = "") -> None:
        t = self.trajs[tid]
        t.turns = None  # free per-turn data
        t.kv_cached = False
        self.state.mark_finished(tid, status)
        if note and self.rec is not None:
            self.rec.event(self.env.now, "Note", trajectory=tid, engine=e, detail=note)
        self._emit(TrajectoryFinished(tid, status, e))

    def _interrupt(self, tid: str, keep: bool) -> None:
        ts = self.state.trajs[tid]
        e = ts.engine
        assert e is not None
        t = self.trajs[tid]
        in_env = t.in_env
        if e in self.engines:
            self._detach(tid, e)
        t.env_token += 1
        t.wasted += t.turn_progress
        t.mid_turn, t.turn_progress, t.moved_at = False, 0, -1.0
        if in_env:
            t.in_env = False
            self._release_sandbox(t)
        if not keep:
            t.wasted += t.output_kept
            t.ctx = t.prompt_kept = t.output_kept = 0
            ts.turns_done, ts.tokens, ts.min_version, ts.max_version = 0, 0, -1, -1
            t.turns_done_kept = 0
        self._finish(tid, TrajStatus.INTERRUPTED, e)
        if e in self.engines:
            self._admit(e)

    def _detach(self, tid: str, e: int) -> None:
        """Take ``tid`` off engine ``e`` (decode batch, queue, KV), keeping turn progress."""
        es = self.state.engines_[e]
        eng = self.engines[e]
        t = self.trajs[tid]
        t.join_token += 1  # cancels a pending KV-transfer join
        if tid in eng.members:
            produced = eng.leave(self.env.now, tid, self._turn_output(tid) - t.turn_progress)
            t.turn_progress += produced
            t.generated += produced
            self._wake(eng)
        es.running.discard(tid)
        if tid in es.queue:
            es.queue.remove(tid)
        eng.env_lru.pop(tid, None)
        eng.release(tid)

    def _turn_output(self, tid: str) -> int:
        t = self.trajs[tid]
        assert t.turns is not None
        return t.turns[1][self.state.trajs[tid].turns_done]

    def _move_out(self, tid: str, e: int) -> None:
        """Migrate ``tid`` off engine ``e`` to the least-loaded other engine."""
        t = self.trajs[tid]
        ts = self.state.trajs[tid]
        had_kv = t.kv_cached or t.mid_turn
        self._detach(tid, e)
        t.kv_cached = False
        t.moved_at = self.env.now if had_kv else -1.0
        ts.migrations += 1
        dest = self.state.least_loaded()
        if self.rec is not None:
            self.rec.event(self.env.now, "Migrate", engine=dest, trajectory=tid, detail=f"from {e}")
        ts.engine = dest
        ts.status = TrajStatus.QUEUED
        if not t.in_env:  # in tool time it joins the queue when the tool call returns
            self.state.engines_[dest].queue.append(tid)
            self._admit(dest)

    # ---------------------------------------------------------------- sync
    def _sync(self, engines: tuple[int, ...]) -> None:
        now = self.env.now
        version = self.state.version
        secs = self.cost.sync_s()
        end = now
        for e in engines:
            eng = self.engines[e]
            eng.sync_end = eng.stall(now, secs)
            end = max(end, eng.sync_end)
            self.state.engines_[e].syncing = True
            self._engine_touch(e)
        if self.rec is not None:
            self.rec.event(now, "SyncStart", version=version, detail=_ids(engines))

        def done() -> None:
            live = tuple(e for e in engines if e in self.engines)
            for e in live:
                self.engines[e].version = version
                self.state.engines_[e].version = version
                self.state.engines_[e].syncing = False
                self._engine_touch(e)
                self._wake(self.engines[e])
            if self.rec is not None:
                self.rec.event(self.env.now, "SyncEnd", version=version, detail=_ids(live))
            self._emit(WeightsSynced(live, version))

        self._later(end - now, done)

    # --------------------------------------------------------------- roles
    def _reassign(self, gpus: tuple[int, ...], role: Role, drain: Drain) -> None:
        self._group_seq += 1
        gid = self._group_seq
        self._switch_groups[gid] = [len(gpus), gpus, role]
        st = self.state
        by_engine: dict[int, list[int]] = {}
        for g in gpus:
            if st.roles[g] is Role.ROLLOUT:
                by_engine.setdefault(st.engine_of(g), []).append(g)
            elif st.roles[g] is Role.TRAIN and self.trainer.running is not None:
                self.trainer.leaving[g] = (gid, role)
            else:
                self._start_switch((g,), gid, role)
        for e in sorted(by_engine):
            self._drain_engine(e, gid, role, drain)

    def _drain_engine(self, e: int, gid: int, role: Role, drain: Drain) -> None:
        es = self.state.engines_[e]
        es.draining = True
        self._engine_switch[e] = (gid, role)
        others = [x for x in self.state.engines_.values() if not x.draining]
        if drain is not Drain.INTERRUPT and not others and (es.running or es.queue):
            drain = Drain.INTERRUPT  # nowhere to migrate to: keep progress, stop here
        for tid in list(es.queue) + sorted(es.running):
            if drain is Drain.INTERRUPT:
                self._interrupt(tid, keep=True)
            elif drain is Drain.MIGRATE or tid in es.queue or self.trajs[tid].in_env:
                self._move_out(tid, e)
        self._maybe_close_engine(e)

    def _maybe_close_engine(self, e: int) -> None:
        es = self.state.engines_.get(e)
        if es is None or not es.draining or es.running or es.queue:
            return
        gid, role = self._engine_switch.pop(e)
        eng = self.engines.pop(e)
        eng.wake_at = float("inf")
        del self.state.engines_[e]
        self._start_switch(es.gpus, gid, role)

    def _start_switch(self, gpus: tuple[int, ...], gid: int, role: Role) -> None:
        st = self.state
        now = self.env.now
        for g in gpus:
            if st.roles[g] is Role.TRAIN:
                self.trainer.gpus.remove(g)
            st.roles[g] = Role.SWITCHING
        self.gpus.set(gpus, GpuState.SWITCH, now)
        if self.rec is not None:
            self.rec.event(now, "SwitchStart", detail=f"{role.value} {_ids(gpus)}")
        self._later(self.cost.switch_s, lambda: self._end_switch(gpus, gid, role))

    def _end_switch(self, gpus: tuple[int, ...], gid: int, role: Role) -> None:
        st = self.state
        now = self.env.now
        for g in gpus:
            st.roles[g] = role
        if role is Role.ROLLOUT:
            for e in sorted({st.engine_of(g) for g in gpus}):
                self._open_engine(e)
        elif role is Role.TRAIN:
            self.trainer.gpus.extend(gpus)
            self.trainer.gpus.sort()
            self.gpus.set(gpus, GpuState.TRAIN_IDLE, now)
        else:
            self.gpus.set(gpus, GpuState.IDLE, now)
        if self.rec is not None:
            self.rec.event(now, "SwitchEnd", detail=f"{role.value} {_ids(gpus)}")
        grp = self._switch_groups[gid]
        grp[0] -= len(gpus)
        if grp[0] == 0:
            del self._switch_groups[gid]
            self._emit(RolesChanged(tuple(grp[1]), grp[2]))
        if role is Role.TRAIN:
            self._trainer_next()

    def _open_engine(self, e: int) -> None:
        from rlsched.cluster.state import EngineState

        gpus = self.state.engine_gpus(e)
        v = self.state.version
        self.state.engines_[e] = EngineState(e, gpus, v, self.kv_capacity)
        eng = EngineSim(e, gpus[0], self.cfg.tp, self.cost, self.kv_capacity, version=v)
        eng.updated = eng.stall_end = self.env.now
        self.engines[e] = eng
        self._engine_touch(e)

    def _engine_touch(self, e: int) -> None:
        """Recompute the engine's GPU state after a change; report an idle engine."""
        es = self.state.engines_.get(e)
        if es is None:
            return
        eng = self.engines[e]
        now = self.env.now
        if eng.sync_end > now:
            state = GpuState.SYNC
        elif eng.members or eng.stall_end > now:
            state = GpuState.GENERATE
        elif es.running:
            state = GpuState.TOOL_WAIT
        else:
            state = GpuState.ROLLOUT_IDLE
        prev = self.gpus.state[es.gpus[0]]
        self.gpus.set(es.gpus, state, now)
        if es.draining:
            self._maybe_close_engine(e)
        elif state is GpuState.ROLLOUT_IDLE and prev != GpuState.ROLLOUT_IDLE.value and not es.queue:
            self._emit(EngineIdle(e))

    # ------------------------------------------------------------- trainer
    def _trained_tokens(self, tid: str) -> int:
        t = self.trajs[tid]
        return t.ctx if t.charged < 0 else t.charged

    def _full_context_flops(self, tids: list[str], trajs: dict[str, SimTraj]) -> float:
        """Default charge: each trajectory trained as one packed sequence of its kept context."""
        f = self.cost.train_flops
        return float(sum(f(trajs[t].ctx) for t in tids))

    def _queue_micro_batch(self, tids: tuple[str, ...]) -> None:
        for tid in tids:
            self.state.trajs[tid].in_micro_batch = True
        self.trainer.jobs.append(MicroBatchJob(tuple(tids)))
        self.state.queued_micro_batches += 1

    def _trainer_next(self) -> None:
        tr = self.trainer
        if tr.running is not None or not tr.jobs or not tr.gpus:
            return
        job = tr.jobs.popleft()
        tr.running = job
        st = self.state
        st.trainer_busy = True
        now = self.env.now
        gpus = tuple(tr.gpus)
        if isinstance(job, MicroBatchJob):
            st.queued_micro_batches -= 1
            secs = self.cost.train_s(self._charge(list(job.trajectories), self.trajs), len(gpus))
        else:
            secs = self.cost.optimizer_step_s
        tr.step_seconds += secs
        self.gpus.set(gpus, GpuState.TRAIN, now, step=st.version)
        self._later(secs, lambda: self._trainer_done(job, gpus))

    def _trainer_done(self, job: MicroBatchJob | OptimizerJob, gpus: tuple[int, ...]) -> None:
        tr = self.trainer
        st = self.state
        now = self.env.now
        tr.running = None
        st.trainer_busy = False
        self.gpus.set(gpus, GpuState.TRAIN_IDLE, now)
        if isinstance(job, MicroBatchJob):
            tr.accumulated.extend(job.trajectories)
            st.accumulated = tr.accumulated
            self._emit(MicroBatchFinished(job.trajectories))
        else:
            trained = tr.accumulated
            st.queued_optimizer_steps -= 1
            st.mark_trained(trained, st.version)
            stale = max((st.version - st.trajs[t].min_version for t in trained), default=0)
            self._steps.append({
                "version": st.version + 1, "time": now, "trajectories": len(trained),
                "trained_tokens": int(sum(self._trained_tokens(t) for t in trained)),
                "train_seconds": tr.step_seconds, "max_staleness": int(stale),
            })
            tr.step_seconds = 0.0
            tr.accumulated = []
            st.accumulated = tr.accumulated
            st.version += 1
            self._emit(TrainStepFinished(st.version))
            if self.progress is not None:
                self.progress(st.version, st.num_steps, now)
            if st.version >= st.num_steps and not self._done.triggered:
                self._done.succeed()
        leaving = dict(tr.leaving)
        tr.leaving.clear()
        for g, (gid, role) in sorted(leaving.items()):
            self._start_switch((g,), gid, role)
        self._trainer_next()


def _ids(xs: tuple[int, ...] | list[int]) -> str:
    xs = sorted(xs)
    if not xs:
        return ""
    if xs == list(range(xs[0], xs[-1] + 1)):
        return f"{xs[0]}-{xs[-1]}" if len(xs) > 1 else str(xs[0])
    return ",".join(map(str, xs))
