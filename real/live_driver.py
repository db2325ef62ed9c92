"""The live driver's event loop: the policy's commands executed on real workers.

Same contract as the simulator (``rlsched.cluster``): the cluster state is a
:class:`~rlsched.cluster.state.ClusterState`, events are delivered one at a time and the
commands they return are checked by ``ClusterState.check`` and applied before the next
event. Time is wall-clock seconds since the run started.

Everything that blocks -- engine calls (Ray futures), environment calls and trainer
operations (worker threads), actor starts -- completes into one queue that the loop
drains in arrival order; the loop thread is the only one that touches the state, so
there are no locks. Role changes are real: an engine leaving rollout is drained and its
actor killed, which frees its Ray slot resources; a trainer rank for that slot can only
start once they are free (``ray_cluster``).
"""

from __future__ import annotations

import heapq
import queue
import random
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

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
from rlsched.cluster.errors import LiveBackendError, PolicyError, RlschedError
from rlsched.cluster.events import (
    Event,
    MicroBatchFinished,
    RolesChanged,
    RunStarted,
    TimerFired,
    TrainStepFinished,
    TrajectoryFinished,
    WeightsSynced,
    WorkerFailed,
)
from rlsched.cluster.ids import Drain, GpuState, Role, TrajStatus
from rlsched.cluster.record import RunRecorder
from rlsched.cluster.state import ClusterState, EngineState

from .agent_loop import AgentTrajectory, Codec
from .engine import EngineSettings, engine_actor_class
from .live_config import LiveSettings
from .live_record import GpuTimeline
from .live_rollout import EngineHandle, Rollout
from .live_trace import describe_command, describe_event, ids_text
from .live_trainer import TrainerLane
from .ray_cluster import SlotCluster, slots_options, wait_ready
from .samples import micro_batch_samples


class LiveDriver:
    def __init__(self, *, policy: Any, state: ClusterState, trajs: dict[str, AgentTrajectory],
                 settings: LiveSettings, engine_settings: EngineSettings, codec: Codec,
                 cluster: SlotCluster, lane: TrainerLane, recorder: RunRecorder,
                 make_env: Callable[[], Any], seed: int, progress: Callable | None = None) -> None:
        self.policy, self.st, self.trajs = policy, state, trajs
        self.settings, self.engine_settings, self.codec = settings, engine_settings, codec
        self.cluster, self.lane, self.rec = cluster, lane, recorder
        self.make_env, self.seed, self.progress = make_env, seed, progress
        self.timeline = GpuTimeline(state.num_gpus, recorder)
        self.rollout = Rollout(self)
        self._actor_cls = engine_actor_class()
        self._events: deque[Event] = deque()
        self._done_q: queue.Queue = queue.Queue()
        self._inflight = 0
        self._timers: list[tuple[float, int, str]] = []
        self._seq = 0
        self._env_pool = ThreadPoolExecutor(settings.env_workers, thread_name_prefix="rlsched-env")
        self._misc_pool = ThreadPoolExecutor(8, thread_name_prefix="rlsched-live")
        self._groups: dict[int, list] = {}
        self._engine_switch: dict[int, tuple[int, Role]] = {}
        self._leaving: dict[int, tuple[int, Role]] = {}
        self.trainer_slots: list[int] = []
        self._lane_ops = 0
        self._jobs: deque[tuple[str, tuple[str, ...]]] = deque()
        self._job_running = False
        self._accumulated: list[str] = []
        self._step_seconds = 0.0
        self.steps: list[dict] = []
        self.trained_tokens: dict[str, int] = {}
        self.stats: dict[str, list] = {"engine_start": [], "sync": [], "switch": [], "trainer": [], "micro_batch": [], "optimizer": []}
        self.events_processed = 0
        self.tokens_generated = 0
        self.engine_busy_seconds = 0.0
        self._t0 = time.monotonic()

    # =============================================================== loop
    def now(self) -> float:
        return time.monotonic() - self._t0

    def run(self) -> bool:
        """Run until the last optimizer step; False if stopped early (time limit, Ctrl-C)."""
        self._t0 = time.monotonic()
        self.policy.reset(self.st, random.Random(self.seed))
        self.emit(RunStarted())
        self._pump()
        deadline = self.settings.max_wall_s
        try:
            while self.st.version < self.st.num_steps:
                if self.now() > deadline:
                    self.rec.event(self.now(), "Note", detail=f"stopped at max_wall_s={deadline:g}")
                    return False
                if not self._inflight and not self._timers and not self._events:
                    raise PolicyError(
                        f"policy {self.policy.name} stalled at t={self.now():.1f}s: nothing is running "
                        f"and only {self.st.version} of {self.st.num_steps} steps are done"
                    )
                wait = 1.0 if not self._timers else max(0.0, min(1.0, self._timers[0][0] - self.now()))
                try:
                    cb, fut = self._done_q.get(timeout=wait)
                except queue.Empty:
                    cb = fut = None
                self.st.advance(self.now())
                self._fire_timers()
                if cb is not None:
                    self._inflight -= 1
                    self.events_processed += 1
                    cb(_result(fut))
                self._pump()
        except KeyboardInterrupt:
            return False
        return True

    def _fire_timers(self) -> None:
        while self._timers and self._timers[0][0] <= self.now():
            _, _, tag = heapq.heappop(self._timers)
            self.emit(TimerFired(tag))

    def _submit(self, fut: Future, cb: Callable[[Any], None]) -> None:
        self._inflight += 1
        fut.add_done_callback(lambda f: self._done_q.put((cb, f)))

    def bg(self, fn: Callable[..., Any], *args: Any, cb: Callable[[Any], None], pool: str = "misc") -> None:
        ex = self._env_pool if pool == "env" else self._misc_pool
        self._submit(ex.submit(fn, *args), cb)

    def ray_call(self, ref: Any, cb: Callable[[Any], None], *, engine: int = -1) -> None:
        def on_done(value: Any) -> None:
            if isinstance(value, _Failed):
                if engine < 0:
                    _raise(value.exc)
                self._engine_failed(engine, value.exc)
                return
            cb(value)

        fut = ref.future()
        self._inflight += 1
        fut.add_done_callback(lambda f: self._done_q.put((on_done, _Catch(f))))

    def emit(self, ev: Event) -> None:
        self._events.append(ev)

    def _pump(self) -> None:
        st = self.st
        st.advance(self.now())
        while self._events:
            ev = self._events.popleft()
            self.events_processed += 1
            describe_event(self.rec, self.now(), ev, st)
            for cmd in self.policy.on_event(ev, st):
                st.check(cmd)
                describe_command(self.rec, self.now(), cmd, st)
                self._apply(cmd)

    # =========================================================== commands
    def _apply(self, cmd: Command) -> None:
        match cmd:
            case Dispatch(trajectories=tids, engine=e):
                for tid in tids:
                    self.rollout.dispatch(tid, e if e is not None else self.st.least_loaded())
            case Reassign(gpus=gpus, role=role, drain=drain):
                self._reassign(gpus, role, drain)
            case TrainMicroBatch(trajectories=tids):
                self._queue_micro_batch(tids)
                self._trainer_next()
            case Train(trajectories=tids):
                self._queue_micro_batch(tids)
                self._jobs.append(("optimizer", ()))
                self.st.queued_optimizer_steps += 1
                self._trainer_next()
            case OptimizerStep():
                self._jobs.append(("optimizer", ()))
                self.st.queued_optimizer_steps += 1
                self._trainer_next()
            case SyncWeights(engines=es):
                self._sync(tuple(es) if es is not None else self.st.engines())
            case Interrupt(trajectories=tids, keep_progress=keep):
                for tid in tids:
                    self.rollout.interrupt(tid, keep)
            case Drop(trajectories=tids):
                for tid in tids:
                    self._close_traj_env(tid)
                self.st.mark_dropped(tids)
            case SetTimer(at=at, tag=tag):
                self._seq += 1
                heapq.heappush(self._timers, (at, self._seq, tag))

    def finish(self, tid: str, status: TrajStatus, e: int, note: str = "") -> None:
        self.st.mark_finished(tid, status)
        if note:
            self.rec.event(self.now(), "Note", trajectory=tid, engine=e, detail=note)
        self.emit(TrajectoryFinished(tid, status, e))

    # -------------------------------------------------------- environments
    def env_call(self, tid: str, epoch: int, kind: str, text: str = "") -> None:
        rt, t = self.rollout.rt[tid], self.trajs[tid]
        if rt.env is None:
            rt.env = self.make_env()
        env = rt.env

        def call() -> Any:
            if kind == "reset":
                return env.reset(t.task_id, seed=t.seed)
            return env.step(text)

        self.bg(call, cb=lambda r: self.rollout.on_env(tid, epoch, kind, r), pool="env")

    def close_env(self, env: Any) -> None:
        self._env_pool.submit(env.close)

    def close_env_later(self, env: Any) -> None:
        self.close_env(env)  # queued behind its running call on the same pool

    def _close_traj_env(self, tid: str) -> None:
        rt = self.rollout.rt[tid]
        if rt.env is not None and not rt.in_env:
            self.close_env(rt.env)
            rt.env = None

    # ================================================================ roles
    def _reassign(self, gpus: tuple[int, ...], role: Role, drain: Drain) -> None:
        self._seq += 1
        gid = self._seq
        self._groups[gid] = [len(gpus), gpus, role, self.now()]
        st = self.st
        by_engine: dict[int, list[int]] = {}
        direct: list[int] = []
        for g in gpus:
            if st.roles[g] is Role.ROLLOUT:
                by_engine.setdefault(st.engine_of(g), []).append(g)
            elif st.roles[g] is Role.TRAIN and self._job_running:
                self._leaving[g] = (gid, role)
            else:
                direct.append(g)
        if direct:
            self._start_switch(tuple(direct), gid, role)
        for e in sorted(by_engine):
            self._drain_engine(e, gid, role, drain)

    def _drain_engine(self, e: int, gid: int, role: Role, drain: Drain) -> None:
        es = self.st.engines_[e]
        es.draining = True
        self._engine_switch[e] = (gid, role)
        others = [x for x in self.st.engines_.values() if not x.draining]
        if drain is not Drain.INTERRUPT and not others and (es.running or es.queue):
            drain = Drain.INTERRUPT  # nowhere to migrate to: keep progress, stop here
        rt = self.rollout.rt
        for tid in list(es.queue) + sorted(es.running):
            if drain is Drain.INTERRUPT:
                self.rollout.interrupt(tid, keep=True)
            elif drain is Drain.MIGRATE or tid in es.queue or rt[tid].in_env or tid not in self.rollout.engines[e].gen:
                self.rollout.move_out(tid, e)
        self.maybe_close_engine(e)

    def maybe_close_engine(self, e: int) -> None:
        es = self.st.engines_.get(e)
        if es is None or not es.draining or es.running or es.queue or not self.rollout.idle(e):
            return
        gid, role = self._engine_switch.pop(e)
        eng = self.rollout.engines.pop(e)
        del self.st.engines_[e]
        import ray

        ray.kill(eng.actor)  # frees the engine's slot resources for the next role
        self.rec.event(self.now(), "EngineStop", engine=e, detail=f"{eng.tokens} tokens")
        self._start_switch(es.gpus, gid, role)

    def _start_switch(self, gpus: tuple[int, ...], gid: int, role: Role) -> None:
        st, now = self.st, self.now()
        leaving_train = [g for g in gpus if st.roles[g] is Role.TRAIN]
        for g in gpus:
            st.roles[g] = Role.SWITCHING
        self.timeline.set(gpus, GpuState.SWITCH, now)
        self.rec.event(now, "SwitchStart", detail=f"{role.value} {ids_text(gpus)}")
        t0 = time.perf_counter()

        def arrive(_: Any = None) -> None:
            if role is Role.ROLLOUT:
                self._boot_engines(gpus, gid, t0)
            elif role is Role.TRAIN:
                self.trainer_slots = sorted({*self.trainer_slots, *gpus})
                self._lane_op(self.trainer_slots, lambda r: self._end_switch(gpus, gid, role, t0, r))
            else:
                self._end_switch(gpus, gid, role, t0)

        if leaving_train:
            self.trainer_slots = [s for s in self.trainer_slots if s not in leaving_train]
            self._lane_op(self.trainer_slots, arrive)
        else:
            arrive()

    def _lane_op(self, slots: list[int], cb: Callable[[Any], None]) -> None:
        self._lane_ops += 1

        def done(r: dict) -> None:
            self._lane_ops -= 1
            self.stats["trainer"].append(r)
            self.rec.event(self.now(), "TrainerResize", detail=f"{r['action']} world={r['world']} {r['seconds']:.2f}s")
            cb(r)
            self._trainer_next()

        self._submit(self.lane.set_slots(slots), done)

    def _boot_engines(self, gpus: tuple[int, ...], gid: int, t0: float) -> None:
        pub = self.lane.weights.current
        engines = sorted({self.st.engine_of(g) for g in gpus})
        for e in engines:
            egpus = self.st.engine_gpus(e)
            version = pub.version if pub is not None else 0
            actor = self._actor_cls.options(**slots_options(egpus, gpus=self.cluster.gpus)).remote(
                self.engine_settings, engine_id=e, version=version)

            def boot(actor: Any = actor, egpus: tuple[int, ...] = egpus, e: int = e) -> dict:
                import ray

                info = wait_ready(actor.info.remote(), f"engine {e}", egpus, self.settings.start_timeout_s)
                if pub is not None:
                    info["sync"] = ray.get(actor.update_weights.remote(pub.ref, pub.version))
                return info

            def booted(info: dict, e: int = e, actor: Any = actor, egpus: tuple[int, ...] = egpus) -> None:
                self.stats["engine_start"].append(info["start_seconds"])
                self.rec.event(self.now(), "EngineStart", engine=e, version=info["version"],
                               detail=f"{info['start_seconds']:.2f}s pid={info['pid']}")
                self.rollout.engines[e] = EngineHandle(e, egpus, actor, info["version"], info["kv_capacity"])
                self.st.engines_[e] = EngineState(e, egpus, info["version"], info["kv_capacity"])
                self._end_switch(egpus, gid, Role.ROLLOUT, t0)

            self.bg(boot, cb=booted)

    def _end_switch(self, gpus: tuple[int, ...], gid: int, role: Role, t0: float, _: Any = None) -> None:
        st, now = self.st, self.now()
        for g in gpus:
            st.roles[g] = role
        if role is Role.ROLLOUT:
            for e in sorted({st.engine_of(g) for g in gpus}):
                self.rollout.touch(e)
        else:
            self.timeline.set(gpus, GpuState.TRAIN_IDLE if role is Role.TRAIN else GpuState.IDLE, now)
        self.rec.event(now, "SwitchEnd", detail=f"{role.value} {ids_text(gpus)} {time.perf_counter() - t0:.2f}s")
        grp = self._groups[gid]
        grp[0] -= len(gpus)
        if grp[0] == 0:
            del self._groups[gid]
            self.stats["switch"].append({"role": role.value, "gpus": len(grp[1]), "seconds": now - grp[3]})
            self.emit(RolesChanged(tuple(grp[1]), grp[2]))
        if role is Role.TRAIN:
            self._trainer_next()

    def _engine_failed(self, e: int, exc: BaseException) -> None:
        """An engine actor died: its trajectories stop (finished turns kept), its GPUs go IDLE."""
        eng = self.rollout.engines.pop(e, None)
        es = self.st.engines_.pop(e, None)
        if eng is None or es is None:
            return
        self.rec.event(self.now(), "Note", engine=e, detail=f"engine failed: {str(exc).splitlines()[0][:120]}")
        for tid in list(es.queue) + sorted(es.running):
            rt = self.rollout.rt[tid]
            rt.pending_abort = rt.want_turn = False
            self.finish(tid, TrajStatus.INTERRUPTED, e)
        for g in es.gpus:
            self.st.roles[g] = Role.IDLE
        self.timeline.set(es.gpus, GpuState.IDLE, self.now())
        for g in es.gpus:
            self.emit(WorkerFailed(g))

    # ============================================================== trainer
    def _queue_micro_batch(self, tids: tuple[str, ...]) -> None:
        for tid in tids:
            self.st.trajs[tid].in_micro_batch = True
        self._jobs.append(("micro", tuple(tids)))
        self.st.queued_micro_batches += 1

    def _trainer_next(self) -> None:
        st = self.st
        if self._job_running or not self._jobs or self._lane_ops or not st.gpus_in(Role.TRAIN):
            return
        kind, tids = self._jobs.popleft()
        self._job_running = True
        st.trainer_busy = True
        gpus = st.gpus_in(Role.TRAIN)
        self.timeline.set(gpus, GpuState.TRAIN, self.now(), step=st.version)
        if kind == "micro":
            st.queued_micro_batches -= 1
            samples, tokens = micro_batch_samples(self.trajs, st, tids)
            self.trained_tokens.update(tokens)
            self._submit(self.lane.micro_batch(samples), lambda r: self._job_done(kind, tids, gpus, r))
        else:
            self._submit(self.lane.optimizer_step(), lambda r: self._job_done(kind, tids, gpus, r))

    def _job_done(self, kind: str, tids: tuple[str, ...], gpus: tuple[int, ...], r: dict) -> None:
        st, now = self.st, self.now()
        self._job_running = False
        st.trainer_busy = False
        self._step_seconds += r["seconds"]
        self.timeline.set([g for g in gpus if st.roles[g] is Role.TRAIN], GpuState.TRAIN_IDLE, now)
        if kind == "micro":
            self.stats["micro_batch"].append(r)
            self._accumulated.extend(tids)
            st.accumulated = self._accumulated
            self.emit(MicroBatchFinished(tids))
        else:
            self.stats["optimizer"].append(r)
            trained = self._accumulated
            st.queued_optimizer_steps -= 1
            st.mark_trained(trained, st.version)
            for tid in trained:
                self._close_traj_env(tid)
            stale = max((st.version - st.trajs[t].min_version for t in trained if st.trajs[t].min_version >= 0), default=0)
            self.steps.append({
                "version": st.version + 1, "time": now, "trajectories": len(trained),
                "trained_tokens": int(sum(self.trained_tokens.get(t, 0) for t in trained)),
                "train_seconds": self._step_seconds, "max_staleness": int(stale),
            })
            self._step_seconds = 0.0
            self._accumulated = []
            st.accumulated = self._accumulated
            st.version += 1
            self.rec.event(now, "WeightsPublished", version=st.version,
                           detail=f"{r['nbytes']} bytes, export {r['export_seconds']:.3f}s")
            self.emit(TrainStepFinished(st.version))
            if self.progress is not None:
                self.progress(st.version, st.num_steps, now)
        leaving = dict(self._leaving)
        self._leaving.clear()
        by_group: dict[tuple[int, Role], list[int]] = {}
        for g, key in sorted(leaving.items()):
            by_group.setdefault(key, []).append(g)
        for (gid, role), gs in by_group.items():
            self._start_switch(tuple(gs), gid, role)
        self._trainer_next()

    # ================================================================= sync
    def _sync(self, engines: tuple[int, ...]) -> None:
        pub = self.lane.weights.current
        live = [e for e in engines if e in self.rollout.engines]
        version = self.st.version
        self.rec.event(self.now(), "SyncStart", version=version, detail=ids_text(live))
        if pub is None or not live:  # version 0: the engines already hold it
            self._sync_done(live, version, {})
            return
        t0 = self.now()
        for e in live:
            self.rollout.engines[e].syncing = True
            self.st.engines_[e].syncing = True
            self.rollout.touch(e)
        left = {"n": len(live)}

        def one(r: dict, e: int) -> None:
            left["n"] -= 1
            if e in self.rollout.engines:
                self.rollout.engines[e].version = r["version"]
                self.st.engines_[e].version = r["version"]
            if left["n"] == 0:
                self.stats["sync"].append({"engines": len(live), "seconds": self.now() - t0,
                                           "bytes": pub.nbytes, "put_seconds": pub.put_seconds})
                self._sync_done(live, pub.version, r)

        for e in live:
            eng = self.rollout.engines[e]
            self.ray_call(eng.actor.update_weights.remote(pub.ref, pub.version), lambda r, e=e: one(r, e), engine=e)

    def _sync_done(self, engines: list[int], version: int, _: Any) -> None:
        alive = tuple(e for e in engines if e in self.rollout.engines)
        for e in alive:
            self.rollout.engines[e].syncing = False
            self.st.engines_[e].syncing = False
            self.rollout.touch(e)
            self.rollout.kick(e)
        self.rec.event(self.now(), "SyncEnd", version=version, detail=ids_text(alive))
        self.emit(WeightsSynced(alive, version))

    # ============================================================= teardown
    def shutdown(self) -> None:
        import ray

        for eng in list(self.rollout.engines.values()):
            ray.kill(eng.actor)
        self.rollout.engines.clear()
        self.lane.shutdown()
        for rt in self.rollout.rt.values():
            if rt.env is not None:
                self._env_pool.submit(rt.env.close)
        self._env_pool.shutdown(wait=True, cancel_futures=True)
        self._misc_pool.shutdown(wait=False, cancel_futures=True)


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Catch:
    """A future whose exception becomes a value, so engine failures reach the loop."""

    def __init__(self, fut: Future) -> None:
        self.fut = fut

    def result(self) -> Any:
        try:
            return self.fut.result()
        except Exception as exc:
            return _Failed(exc)


def _result(fut: Any) -> Any:
    try:
        return fut.result()
    except RlschedError:
        raise
    except Exception as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, RlschedError):
            raise type(cause)(str(cause).splitlines()[0]) from None
        raise


def _raise(exc: BaseException) -> None:
    cause = getattr(exc, "cause", None)
    if isinstance(cause, RlschedError):
        raise type(cause)(str(cause).splitlines()[0]) from None
    raise LiveBackendError(f"live backend: a worker failed: {str(exc).strip().splitlines()[0][:200]}") from exc

