"""Rollout on live engines: admitting trajectories, feeding engines turns, running tools.

Each engine actor is fed by at most one outstanding ``step`` call carrying the turns to
admit and the requests to abort; the reply carries finished turns (and the tokens aborted
ones had produced). Turns and aborts that come up while that call runs go to it at once
through the actor's ``submit`` (its inbox), so a turn whose tool call returned joins the
running batch instead of waiting for another trajectory's turn to finish (issue #11).
A finished turn goes to the trajectory's environment in a worker
thread (real tool time); its observation is appended and the next turn is requested, on
the engine the trajectory is on *then* -- so a trajectory migrated during tool time simply
continues elsewhere, and one migrated mid-turn re-prefills its context (including the
tokens of the turn so far) on the new engine and finishes the turn there.

Everything here runs on the driver's event-loop thread; only ``env.reset``/``env.step``
and the engine calls run elsewhere.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlsched.cluster.events import EngineIdle
from rlsched.cluster.ids import GpuState, TrajStatus
from rlsched.real.rollout.engine import INBOX, StepReport, TurnRequest

if TYPE_CHECKING:
    from rlsched.real.loop.driver import LiveDriver


@dataclass
class EngineHandle:
    """Driver-side state of one engine actor."""

    id: int
    gpus: tuple[int, ...]
    actor: Any
    version: int
    kv_capacity: int
    stepping: bool = False
    syncing: bool = False
    adds: list[TurnRequest] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)
    gen: dict[str, str] = field(default_factory=dict)  # trajectory -> request id generating
    rids: dict[str, tuple[str, int]] = field(default_factory=dict)  # request -> (trajectory, epoch)
    state: GpuState | None = None
    tokens: int = 0
    gen_seconds: float = 0.0


@dataclass
class TrajRuntime:
    """Per-trajectory flags the event loop needs besides the agent's token state."""

    epoch: int = 0  # bumped by a restart: results of older calls are discarded
    in_env: bool = False  # an env.reset/env.step call is running
    pending_abort: bool = False  # its request was aborted; the partial output is on its way
    want_turn: bool = False  # request the next generation once the partial output arrived
    drop_partial: bool = False  # interrupted keeping progress: the turn in progress is lost
    turn_seq: int = 0
    turn_version: int = -1  # the turn in progress: the oldest version generating it
    last_output: int = 0  # the finished turn waiting on its tool call: its tokens ...
    last_version: int = -1  # ... and its version, recorded when the call returns
    last_stopped: bool = False
    env: Any = None


class Rollout:
    def __init__(self, host: LiveDriver) -> None:
        self.h = host
        self.engines: dict[int, EngineHandle] = {}
        self.rt: dict[str, TrajRuntime] = {tid: TrajRuntime() for tid in host.st.trajs}

    # ------------------------------------------------------------- dispatch
    def dispatch(self, tid: str, e: int) -> None:
        """``Dispatch`` to engine ``e``: pinned there (it runs every turn there)."""
        st = self.h.st
        st.mark_dispatched(tid, e)
        if self.rt[tid].in_env:
            return  # interrupted in a tool call that still runs: it queues when the call returns
        st.engines_[e].enqueue(tid)
        self.admit(e)

    def dispatch_unbound(self, tids: tuple[str, ...] | list[str]) -> None:
        """``Dispatch`` without an engine (late binding, as the simulator's): into the
        cluster queue (``ClusterState.unbound``), then placed head first, each on the
        least-loaded engine on which it fits (:meth:`place_all`); what fits nowhere waits
        there until an engine frees room (:meth:`admit`)."""
        st = self.h.st
        for tid in tids:
            st.mark_dispatched(tid, None)
            if not self.rt[tid].in_env:  # (in a tool call: it queues when the call returns)
                st.enqueue_unbound(tid)
        self.place_all()

    def _need(self, tid: str) -> int:
        """KV tokens admission reserves for ``tid``: its context (with the turn's output so
        far) and a whole turn's output."""
        return len(self.h.trajs[tid].context()) + self.h.settings.max_tokens_per_turn

    def _fits(self, e: int, tid: str) -> bool:
        """Engine ``e`` has a sequence slot and KV room for ``tid`` now (an empty engine
        always takes one: vLLM then preempts or truncates, as for a pinned one)."""
        es = self.h.st.engines_[e]
        if e not in self.engines or es.draining or len(es.running) >= self.h.settings.max_num_seqs:
            return False
        return not es.running or es.kv_used + self._need(tid) <= es.kv_capacity

    def place_all(self) -> None:
        """Admit the cluster queue, head first, each on the least-loaded active engine
        (running + queued, lowest id) on which it fits and whose weights may generate it
        (``ClusterState.may_bind``); stop at the first that fits nowhere it may go (FIFO),
        as ``sim.lifecycle.Lifecycle._place_all``."""
        st = self.h.st
        skipped: list[str] = []  # (no engine up may take it: its weights too old for its step)
        while st.unbound:
            tid = st.unbound[0]
            allowed = [e for e, _ in sorted(st.engine_loads(), key=lambda x: (x[1], x[0]))
                       if st.may_bind(tid, st.engines_[e].version)]
            if not allowed and st.engines_:
                skipped.append(st.unbound.popleft())
                continue
            for e in allowed:
                if self._fits(e, tid):
                    self._admit_unbound(tid, e)
                    break
            else:
                break
        st.unbound.extendleft(reversed(skipped))

    def _admit_unbound(self, tid: str, e: int) -> None:
        st = self.h.st
        es = st.engines_[e]
        need = self._need(tid)
        st.take_unbound(tid)
        st.mark_running(tid, e)
        es.admit(tid)
        es.set_kv(es.kv_used + need)
        self.start(tid)
        self.touch(e)

    def admit(self, e: int) -> None:
        """Admit queued trajectories while the engine has sequence and KV room: its own
        queue first (FIFO), then the cluster queue's head while it fits here."""
        st = self.h.st
        es = st.engines_.get(e)
        if es is None:
            return
        while es.queue and not es.draining:
            tid = es.queue[0]
            if not self._fits(e, tid):
                break
            need = self._need(tid)
            es.dequeue(admit=True)
            es.set_kv(es.kv_used + need)
            st.mark_running(tid, e)
            self.start(tid)
        while st.unbound and not es.queue and e in st.engines_:
            tid = st.first_bindable(es.version)  # (the head, unless its weights are too new here)
            if tid is None or not self._fits(e, tid):
                break
            self._admit_unbound(tid, e)
        self.touch(e)

    def start(self, tid: str) -> None:
        """A trajectory was admitted: reset its environment, or continue where it was."""
        t, rt = self.h.trajs[tid], self.rt[tid]
        if rt.in_env:
            return  # its tool call returns to the engine it is on by then
        if t.done or t.truncated:
            self.complete(tid, TrajStatus.DONE if t.done else TrajStatus.TIMED_OUT)
        elif not t.started:
            rt.in_env = True
            self.h.env_call(tid, rt.epoch, "reset")
        else:
            self.request(tid)

    # ----------------------------------------------------------- generation
    def request(self, tid: str) -> None:
        st, s = self.h.st, self.h.settings
        t, rt, ts = self.h.trajs[tid], self.rt[tid], st.trajs[tid]
        if ts.status is not TrajStatus.RUNNING or ts.engine not in self.engines:
            return
        if rt.pending_abort:
            rt.want_turn = True
            return
        eng = self.engines[ts.engine]
        ctx = t.context()
        remaining = s.max_tokens_per_turn - len(t.partial)
        if len(ctx) + s.max_tokens_per_turn > s.max_model_len:
            t.truncated = True  # the context is full: keep the finished turns
            self.complete(tid, TrajStatus.TIMED_OUT, note="context reached max_model_len")
            return
        if remaining <= 0:
            self.turn_generated(tid, rt.turn_version, stopped=False)
            return
        rid = f"{tid}#{rt.turn_seq}"
        seed = zlib.crc32(f"{self.h.seed}/{rid}".encode()) & 0x7FFFFFFF
        rt.turn_seq += 1
        if rt.turn_version < 0 or not t.partial:
            rt.turn_version = eng.version
        eos = self.h.codec.eos_id
        eng.adds.append(TurnRequest(rid, ctx, remaining, s.temperature, seed, (eos,) if eos is not None else ()))
        eng.rids[rid] = (tid, rt.epoch)
        eng.gen[tid] = rid
        self.kick(eng.id)
        self.touch(eng.id)

    def kick(self, e: int) -> None:
        """Send the engine its pending turns and aborts: to the running ``step`` call
        (``submit``), or with a new call. A new call goes out while any request still owes
        its output (``rids``), so an abort or turn handed to a call that ended first is
        picked up by the next one. Nothing is sent while the engine's weights are syncing
        (it generates nothing then)."""
        eng = self.engines.get(e)
        if eng is None or eng.syncing:
            return
        if eng.stepping:
            if eng.adds or eng.aborts:
                adds, aborts = eng.adds, eng.aborts
                eng.adds, eng.aborts = [], []
                self.h.engine_submits += 1
                ref = eng.actor.submit.options(concurrency_group=INBOX).remote(adds, aborts)
                self.h.ray_call(ref, _ignore, engine=e)
            return
        if not (eng.adds or eng.aborts or eng.gen or eng.rids):
            return
        adds, aborts = eng.adds, eng.aborts
        eng.adds, eng.aborts = [], []
        eng.stepping = True
        ref = eng.actor.step.remote(adds, aborts, self.h.settings.step_slice_s)
        self.h.ray_call(ref, lambda rep, e=e: self.on_step(e, rep), engine=e)

    def on_step(self, e: int, rep: StepReport) -> None:
        eng = self.engines[e]
        eng.stepping = False
        eng.tokens += rep.tokens
        eng.gen_seconds += rep.seconds
        self.h.tokens_generated += rep.tokens
        self.h.engine_busy_seconds += rep.seconds
        self.h.engine_iterations += rep.iterations
        self.h.engine_batched += rep.batched
        for out in rep.outputs:
            owner = eng.rids.pop(out.rid, None)
            if owner is None:
                continue
            tid, epoch = owner
            t, rt = self.h.trajs[tid], self.rt[tid]
            if eng.gen.get(tid) == out.rid:
                del eng.gen[tid]
            if epoch != rt.epoch:
                t.wasted += len(out.token_ids)
                t.generated += len(out.token_ids)
                continue
            version = min(rt.turn_version, rep.version) if rt.turn_version >= 0 else rep.version
            if rt.drop_partial and not out.finished:  # interrupted mid-turn: the turn is lost
                rt.drop_partial = rt.pending_abort = False
                t.generated += len(out.token_ids)
                t.wasted += len(out.token_ids)
                _drop_partial(t, rt)
                if rt.want_turn:
                    rt.want_turn = False
                    self.request(tid)
                continue
            rt.drop_partial = False  # (a finished turn is kept, as every finished turn)
            t.add_output(out.token_ids, version, out.logprobs, out.versions)
            if out.finished:  # an abort that crossed the finished turn: nothing more comes
                rt.pending_abort = rt.want_turn = False
            else:  # aborted by a move: progress kept
                rt.pending_abort = False
                ts = self.h.st.trajs[tid]
                if ts.engine != e and ts.status in (TrajStatus.QUEUED, TrajStatus.RUNNING):
                    self.h.rec.event(self.h.now(), "Note", engine=e, trajectory=tid, detail=(
                        f"moved mid-turn: {len(out.token_ids)} tokens kept ({len(t.partial)} of the turn so far); "
                        f"it continues the turn {'on engine ' + str(ts.engine) if ts.engine is not None else 'where it is placed'}, "
                        "its context prefilled again (no KV transfer between live engines)"))
                if rt.want_turn:
                    rt.want_turn = False
                    self.request(tid)
                continue
            self.turn_generated(tid, version, stopped=out.stopped)
        self.kick(e)
        self.touch(e)

    def turn_generated(self, tid: str, version: int, *, stopped: bool) -> None:
        """The current turn's generation is complete: its text goes to the environment."""
        t, rt, ts = self.h.trajs[tid], self.rt[tid], self.h.st.trajs[tid]
        out, v = t.finish_turn(version)
        rt.turn_version, rt.last_output, rt.last_version, rt.last_stopped = -1, len(out), v, stopped
        rt.in_env = True
        self.h.env_call(tid, rt.epoch, "step", self.h.codec.decode(out))
        e = ts.engine
        es = self.h.st.engines_.get(e) if e is not None else None
        if es is not None and es.draining and ts.status is TrajStatus.RUNNING:
            self.move_out(tid, e)  # finish_turn drain: leave between turns
        elif e is not None:
            self.touch(e)

    # ------------------------------------------------------------ environment
    def on_env(self, tid: str, epoch: int, kind: str, result: Any) -> None:
        t, rt, ts = self.h.trajs[tid], self.rt[tid], self.h.st.trajs[tid]
        if epoch != rt.epoch or ts.status in (TrajStatus.TRAINED, TrajStatus.DROPPED):
            return
        rt.in_env = False
        s = self.h.settings
        if kind == "reset":
            t.start(self.h.codec, result)
        else:
            for failure in getattr(result, "tool_failures", ()):  # a failed tool call, not a failed run
                self.h.rec.event(self.h.now(), "ToolFailure", trajectory=tid, detail=failure[:300])
            t.record_turn(rt.last_output, result.seconds, rt.last_version)
            ts.turns_done, ts.tokens = t.turns_done, len(t.token_ids)
            ts.min_version = t.min_version
            ts.max_version = t.max_version
            if result.done:
                t.done, t.reward = True, float(result.reward)
            elif t.turns_done >= s.max_turns:
                t.truncated = True
            else:
                t.add_observation(self.h.codec, result.observation, rt.last_stopped, s.max_observation_tokens)
        self.resume_after_env(tid)

    def resume_after_env(self, tid: str) -> None:
        t, ts = self.h.trajs[tid], self.h.st.trajs[tid]
        if ts.status is TrajStatus.RUNNING:
            if t.done or t.truncated:
                self.complete(tid, TrajStatus.DONE if t.done else TrajStatus.TIMED_OUT)
            elif not ts.pinned and self._requeue_if_full(tid):
                return
            else:
                self.request(tid)
        elif ts.status is TrajStatus.QUEUED:
            self._rejoin(tid)
        if ts.engine in self.engines:
            self.touch(ts.engine)

    def _rejoin(self, tid: str) -> None:
        """Moved (or dispatched) during tool time: join the queue of the engine it is
        pinned to, else (unpinned, or that engine has left rollout) the cluster queue's
        head -- as ``sim.lifecycle.Lifecycle._rejoin_after_tool``."""
        st = self.h.st
        ts = st.trajs[tid]
        e = ts.engine
        es = st.engines_.get(e) if e is not None and ts.pinned else None
        if es is not None and tid in es.queue:
            self.admit(e)  # (a move crossed its turn's end: it already waits there)
            return
        if es is None or es.draining:
            if not st.engines():
                self.h.finish(tid, TrajStatus.INTERRUPTED, e if e is not None else -1, note="no rollout engine left")
                return
            if tid not in st.unbound:
                st.enqueue_unbound(tid, front=True)
            self.place_all()
            return
        es.enqueue(tid)
        self.admit(es.id)

    def _requeue_if_full(self, tid: str) -> bool:
        """Late binding: an unpinned trajectory whose next turn no longer fits its
        engine's KV (its context grew by the tool's observation) leaves it for the
        cluster queue's head, to be placed where it fits -- the simulator's ``Requeue``
        (``Lifecycle._wait_for_kv``). Its context is prefilled again there."""
        st = self.h.st
        ts = st.trajs[tid]
        e = ts.engine
        es = st.engines_.get(e) if e is not None else None
        if es is None or len(es.running) < 2:
            return False  # alone on its engine: it stays (vLLM preempts or truncates)
        s = self.h.settings
        used = sum(len(self.h.trajs[x].context()) + s.max_tokens_per_turn for x in es.running)
        if used <= es.kv_capacity:
            return False
        self.h.rec.event(self.h.now(), "Requeue", engine=e, trajectory=tid,
                         detail=f"{len(self.h.trajs[tid].token_ids)} tokens of context")
        self.detach(tid, e)
        st.mark_queued(tid, None, pinned=False)
        st.enqueue_unbound(tid, front=True)
        self.place_all()
        self.admit(e)
        return True

    # ------------------------------------------------------- leaving an engine
    def complete(self, tid: str, status: TrajStatus, note: str = "") -> None:
        ts = self.h.st.trajs[tid]
        e = ts.engine if ts.engine is not None else -1
        self.detach(tid, e)
        rt = self.rt[tid]
        if rt.env is not None and status is not TrajStatus.INTERRUPTED:
            self.h.close_env(rt.env)
            rt.env = None
        self.h.finish(tid, status, e, note=note)
        self.admit(e)

    def detach(self, tid: str, e: int) -> None:
        """Take ``tid`` off engine ``e`` (request, queue, admission), keeping its progress."""
        es = self.h.st.engines_.get(e)
        eng = self.engines.get(e)
        if eng is not None and tid in eng.gen:
            rid = eng.gen.pop(tid)
            pending = [r for r in eng.adds if r.rid == rid]
            if pending:  # never reached the engine: nothing to abort
                eng.adds.remove(pending[0])
                eng.rids.pop(rid, None)
            else:
                eng.aborts.append(rid)
                self.rt[tid].pending_abort = True
                self.kick(e)
        if es is not None:
            es.discard(tid)
            self.touch(e)

    def move_out(self, tid: str, e: int) -> None:
        """Migrate ``tid`` off engine ``e``, which leaves rollout, to the head of the
        cluster queue, unpinned, and place it (``Lifecycle._move_out``)."""
        self.move(tid, None)
        self.place_all()

    def move_all(self, tids: tuple[str, ...], dest: int | None) -> None:
        """The ``Move`` command: each of ``tids`` in turn, then admission where they went
        and on the engines they left (``Lifecycle._move_all``). Sent to the cluster queue,
        they keep their order at its head."""
        st = self.h.st
        left: dict[int, None] = {}
        for tid in (reversed(tids) if dest is None else tids):
            e = st.trajs[tid].engine
            self.move(tid, dest)
            if e is not None and e != dest:
                left[e] = None
        if dest is not None:
            self.admit(dest)
        self.place_all()
        for e in left:
            es = st.engines_.get(e)
            if es is not None and not es.draining:
                self.admit(e)

    def move(self, tid: str, dest: int | None) -> None:
        """``Move`` one trajectory (queued or running) to engine ``dest`` (pinned) or, with
        None, to the head of the cluster queue (unpinned) -- ``Lifecycle._move``. The
        caller admits.

        Where it is decoding, its request is aborted and the tokens it generated so far
        are kept (``detach``; they come back in the engine's next reply); the turn goes on
        where it is admitted next, by prefilling its context *and* those tokens again --
        live engines hand no KV to each other (vLLM on CPU has no KV connector), so a
        move costs a re-prefill, as the cost model's ``migrate_s`` by prefill. In a tool
        call it is only rebound: its next turn is requested on the new engine when the
        call returns (:meth:`_rejoin`). A context that was resident (admitted) on its
        engine is recorded as ``Migrate``, as in the simulator."""
        st = self.h.st
        ts = st.trajs[tid]
        e = ts.engine
        if e is not None and e == dest:  # unpinned and already there: pin it
            st.pin(tid)
            return
        had_kv = False
        if e is None:
            st.take_unbound(tid)
        else:
            es = st.engines_.get(e)
            had_kv = es is not None and tid in es.running
            self.detach(tid, e)
            if had_kv:
                self.h.rec.event(self.h.now(), "Migrate", engine=-1 if dest is None else dest,
                                 trajectory=tid, detail=f"from {e}")
        st.mark_queued(tid, dest, pinned=dest is not None, migrated=had_kv)
        in_env = self.rt[tid].in_env  # (in tool time it joins when the tool call returns)
        if dest is None:
            if not in_env:
                st.enqueue_unbound(tid, front=True)
        else:
            if not in_env:
                st.engines_[dest].enqueue(tid)

    def strand_unbound(self) -> None:
        """No active rollout engine is left: the cluster queue's trajectories stop, their
        finished turns kept, for the policy to dispatch again once engines are back
        (``Roles._strand_unbound`` in the simulator)."""
        st = self.h.st
        while st.unbound:
            self.interrupt(st.unbound[0], keep=True)

    def interrupt(self, tid: str, keep: bool) -> None:
        ts = self.h.st.trajs[tid]
        e = ts.engine if ts.engine is not None else -1
        self.h.st.take_unbound(tid)
        self.detach(tid, e)
        rt = self.rt[tid]
        if keep:
            # ``keep_progress`` keeps the finished turns (the contract, and the simulator):
            # the turn in progress is lost -- now, or when the aborted request's tokens
            # come back (unless it had finished meanwhile: then it is a finished turn)
            if rt.pending_abort:
                rt.drop_partial = True
            else:
                _drop_partial(self.h.trajs[tid], rt)
        else:
            self.h.trajs[tid].restart()
            rt.epoch += 1  # late results of the old attempt are dropped
            rt.pending_abort = rt.want_turn = False
            if rt.in_env and rt.env is not None:
                self.h.close_env_later(rt.env)
            elif rt.env is not None:
                self.h.close_env(rt.env)
            rt.env, rt.in_env, rt.turn_version = None, False, -1
            self.h.st.reset_progress(tid)
        self.h.finish(tid, TrajStatus.INTERRUPTED, e)
        self.admit(e)

    # ------------------------------------------------------------------ state
    def touch(self, e: int) -> None:
        """Recompute the engine's GPU state and KV use; report an idle engine."""
        es = self.h.st.engines_.get(e)
        eng = self.engines.get(e)
        if es is None or eng is None:
            return
        if eng.syncing:
            state = GpuState.SYNC
        elif eng.gen:
            state = GpuState.GENERATE
        elif es.running:
            state = GpuState.TOOL_WAIT
        else:
            state = GpuState.ROLLOUT_IDLE
        s = self.h.settings
        es.set_kv(sum(len(self.h.trajs[t].context()) + s.max_tokens_per_turn for t in es.running))
        prev, eng.state = eng.state, state
        self.h.timeline.set(es.gpus, state, self.h.now())
        if es.draining:
            self.h.maybe_close_engine(e)
        elif state is GpuState.ROLLOUT_IDLE and prev is not GpuState.ROLLOUT_IDLE and not es.queue:
            self.h.emit(EngineIdle(e))

    def idle(self, e: int) -> bool:
        """No request, abort or step outstanding: the actor may be stopped."""
        eng = self.engines[e]
        return not (eng.stepping or eng.adds or eng.aborts or eng.rids or eng.gen)


def _drop_partial(t: Any, rt: TrajRuntime) -> None:
    """Throw away the turn in progress of ``t`` (its tokens count as wasted). A finished
    turn waiting on its tool call is not in progress: its version is ``rt.last_version``."""
    t.wasted += len(t.partial)
    t.partial, t.partial_version = [], -1
    t.partial_logprobs, t.partial_versions = [], []
    rt.turn_version = -1


def _ignore(_: Any) -> None:
    """``submit``'s reply (the inbox length) needs no handling; a failure reaches
    ``ray_call``'s engine-failure path like a ``step`` call's."""
