"""Trajectory lifecycle in the simulator: dispatch, admission under KV capacity, turns
(prefill + shared-rate decode), tool time with sandbox slots, finish, interrupt, migration.

The two timers every simulated turn fires (an engine wake-up when a decode ends, a
tool-call return) are the inner loop and live in :mod:`.turns`; they call the methods
here on their uncommon paths. These methods work on :class:`~rlsched.sim.traj.SimTraj`
and :class:`~rlsched.sim.engine.EngineSim` objects rather than ids, and touch ids only
where the policy-visible ``ClusterState`` needs them.
"""

from __future__ import annotations

from heapq import heappush

from rlsched.cluster.events import TrajectoryFinished
from rlsched.cluster.ids import GpuState, TrajStatus

from .core import DriverCore
from .engine import EngineSim
from .timers import NORMAL, Call
from .traj import SimTraj

_INF = float("inf")
_QUEUED = TrajStatus.QUEUED
_RUNNING = TrajStatus.RUNNING
_INTERRUPTED = TrajStatus.INTERRUPTED
_TIMED_OUT = TrajStatus.TIMED_OUT
_DONE = TrajStatus.DONE
_GENERATE = GpuState.GENERATE


class Lifecycle(DriverCore):
    """Methods of :class:`~rlsched.sim.driver.SimDriver` that move trajectories along."""

    # ---------------------------------------------------------- dispatch
    def _dispatch(self, t: SimTraj, eng: EngineSim) -> None:
        st = self.state
        st.advance(self.now)
        ts = t.ts
        if ts.status is _INTERRUPTED:
            st.mark_resumable(t.tid)
        st.mark_active(t.tid, _QUEUED, eng.id)
        if t.in_env:
            return  # interrupted in a tool call that still runs: it queues when the call returns
        if ts.turns_done == t.n_turns:  # interrupted in its last tool call, which has returned
            self._complete(t, eng.id)
            return
        eng.es.enqueue(t.tid)
        self._admit(eng)

    def _admit(self, eng: EngineSim) -> None:
        """Start queued trajectories while the engine's KV cache has room (FIFO)."""
        es = eng.es
        queue = es.queue
        trajs = self.trajs
        while queue and not es.draining:
            t = trajs[queue[0]]
            row = t.first + t.ts.turns_done
            need = t.ctx + self.w_prompt[row] + self.w_output[row]
            if need > eng.kv_capacity:
                es.dequeue(admit=False)
                self._finish(t, _TIMED_OUT, eng.id, note="context exceeds KV capacity")
                continue
            if not eng.reserve(t, need):
                break
            if eng.evicted:
                self._drain_evictions(eng)
            es.dequeue(admit=True)
            t.ts.status = _RUNNING
            self._start_turn(t, eng)
        self._engine_touch(eng)

    def _drain_evictions(self, eng: EngineSim) -> None:
        for v in eng.evicted:
            v.kv_cached = False
            if self.rec is not None:
                self.rec.event(self.now, "Evict", engine=eng.id, trajectory=v.tid)
        eng.evicted.clear()

    # -------------------------------------------------------------- turns
    def _start_turn(self, t: SimTraj, eng: EngineSim) -> bool:
        """Prefill the turn's new tokens and join the decode batch; False if it waits for
        its KV to arrive (the engine's GPU state is then not updated here)."""
        p = self.w_prompt[t.first + t.ts.turns_done]
        mid = t.mid_turn
        delay = 0.0
        if t.kv_cached:
            new, cached = (0 if mid else p), t.ctx + (p if mid else 0)
        else:
            held = t.ctx + ((p + t.turn_progress) if mid else 0)
            if t.moved_at >= 0.0 and held > 0:
                secs, by_prefill = self.cost.migrate_s(self.cfg.tp, held)
                if by_prefill:
                    new, cached = held + (0 if mid else p), 0
                else:
                    now = self.now
                    delay = max(0.0, t.moved_at + secs - now)
                    new, cached = (0 if mid else p), held
            else:
                new, cached = held + (0 if mid else p), 0
        t.moved_at = -1.0
        t.kv_cached = True
        t.mid_turn = True
        t.turn_version = eng.version
        if delay > 0.0:
            # KV still in transit: the trajectory waits; the engine is not blocked.
            self._later(delay, self._join_after_transfer, t, (eng.id, new, cached, t.join_token))
            return False
        eng.join(self.now, t, cached, new, self.w_output[t.first + t.ts.turns_done] - t.turn_progress)
        self._engine_touch(eng)
        eng.rearm(self.now)
        return True

    def _join_after_transfer(self, t: SimTraj, args: tuple[int, int, int, int]) -> None:
        e, new, cached, token = args
        ts = t.ts
        if token != t.join_token or ts.engine != e or ts.status is not _RUNNING:
            return  # moved or interrupted while its KV was in transit
        self._join(t, self.engines[e], new, cached)

    def _join(self, t: SimTraj, eng: EngineSim, new: int, cached: int) -> None:
        eng.join(self.now, t, cached, new, self.w_output[t.first + t.ts.turns_done] - t.turn_progress)
        self._engine_touch(eng)
        eng.rearm(self.now)

    # ------------------------------------------------ the per-turn timers
    # (the two timers every turn fires, and the end of a turn, are in .turns)

    def _done_on(self, t: SimTraj, eng: EngineSim) -> None:
        """Every turn (and the last tool call) of ``t`` is done: it leaves engine ``eng``."""
        eng.es.discard(t.tid)
        eng.env_lru.pop(t, None)
        eng.release(t)
        self._complete(t, eng.id)
        self._admit(eng)

    def _complete(self, t: SimTraj, e: int) -> None:
        """``t`` has run every turn and tool call it has: done (timed out if the trace cut it)."""
        self._finish(t, _TIMED_OUT if t.truncated else _DONE, e)

    def _env_later(self, t: SimTraj, delay: float, token: int) -> None:
        """The tool call of ``t`` (``env_token`` = ``token``) returns in ``delay`` seconds."""
        if t.callbacks is None:  # the trajectory is its own timer event (see core)
            t.callbacks = self._env_callbacks
            t.timer_token = token
            ev: object = t
        else:
            ev = Call(self._env_callbacks, None, t, token)
        heappush(self._queue, (self.now + (delay if delay > 0.0 else 0.0), NORMAL, next(self._eid), ev))

    def _rejoin_after_tool(self, t: SimTraj) -> None:
        """Moved off its engine during tool time: join the queue of its new engine (or of
        another one if that engine has since left rollout)."""
        ts = t.ts
        e = ts.engine
        if ts.turns_done == t.n_turns:  # that was its last tool call: done, no engine needed
            self._complete(t, e)
            return
        es = self.state.engines_.get(e)
        if es is None or es.draining:
            if not self.state.engines():
                self._finish(t, _INTERRUPTED, e, note="no rollout engine left")
                return
            e = ts.engine = self.state.least_loaded()
        eng = self.engines[e]
        eng.es.enqueue(t.tid)
        self._admit(eng)

    def _wait_for_kv(self, t: SimTraj, eng: EngineSim) -> None:
        """No room even after evicting idle contexts: wait at the head of the queue."""
        self._drain_evictions(eng)
        eng.release(t)
        t.kv_cached = False
        es = eng.es
        es.discard(t.tid)
        es.enqueue(t.tid, front=True)
        t.ts.status = _QUEUED
        self._engine_touch(eng)

    def _release_sandbox(self, t: SimTraj) -> None:
        if t.waiting_sandbox:
            t.waiting_sandbox = False
            self.sandbox_queue.remove(t)
        if not t.sandbox:
            return
        t.sandbox = False
        self.sandbox_free += 1
        while self.sandbox_free > 0 and self.sandbox_queue:
            u = self.sandbox_queue.popleft()
            u.waiting_sandbox = False
            u.sandbox = True
            self.sandbox_free -= 1
            env_s = self.w_env[u.first + u.ts.turns_done - 1]  # (the call of its last turn)
            if self.fault.hangs:
                env_s = self._hang(u, env_s)
            self._env_later(u, env_s, u.env_token)

    # ------------------------------------------------------ leaving engines
    def _finish(self, t: SimTraj, status: TrajStatus, e: int, note: str = "") -> None:
        t.kv_cached = False
        self.state.advance(self.now)
        self.state.mark_finished(t.tid, status)
        if note and self.rec is not None:
            self.rec.event(self.now, "Note", trajectory=t.tid, engine=e, detail=note)
        self._emit(TrajectoryFinished(t.tid, status, e))

    def _interrupt(self, t: SimTraj, keep: bool) -> None:
        ts = t.ts
        e = ts.engine
        eng = self.engines.get(e)
        in_env = t.in_env
        if eng is not None:
            self._detach(t, eng)
        t.wasted += t.turn_progress
        t.mid_turn, t.turn_progress, t.moved_at = False, 0, -1.0
        # Keeping progress, a tool call in flight runs on (as on the live driver): the next
        # turn's prompt is its output, so a resumed trajectory waits for it (see _dispatch
        # and _env_timer). Starting over abandons it.
        if not (in_env and keep):
            t.env_token += 1  # cancels a pending tool-call completion
            t.hung = 0.0
            if in_env:
                t.in_env = False
                self._release_sandbox(t)
        if not keep:
            t.wasted += t.output_kept
            t.ctx = t.prompt_kept = t.output_kept = 0
            ts.turns_done, ts.tokens, ts.min_version, ts.max_version = 0, 0, -1, -1
        self._finish(t, _INTERRUPTED, e)
        if eng is not None and not eng.closed:
            self._admit(eng)

    def _detach(self, t: SimTraj, eng: EngineSim) -> None:
        """Take ``t`` off engine ``eng`` (decode batch, queue, KV), keeping turn progress."""
        es = eng.es
        t.join_token += 1  # cancels a pending KV-transfer join
        if t in eng.members:
            produced = eng.leave(self.now, t, self.w_output[t.first + t.ts.turns_done] - t.turn_progress)
            t.turn_progress += produced
            t.generated += produced
            eng.rearm(self.now)
        es.discard(t.tid)
        eng.env_lru.pop(t, None)
        eng.release(t)

    def _move_out(self, t: SimTraj, eng: EngineSim) -> None:
        """Migrate ``t`` off engine ``eng`` to the least-loaded other engine (or, if a
        failure left none, stop it with its finished turns kept)."""
        if not self.state.engines():
            self._interrupt(t, keep=True)
            return
        ts = t.ts
        had_kv = t.kv_cached or t.mid_turn
        self._detach(t, eng)
        t.kv_cached = False
        now = self.now
        t.moved_at = now if had_kv else -1.0
        ts.migrations += 1
        dest = self.state.least_loaded()
        if self.rec is not None:
            self.rec.event(now, "Migrate", engine=dest, trajectory=t.tid, detail=f"from {eng.id}")
        ts.engine = dest
        ts.status = _QUEUED
        if not t.in_env:  # in tool time it joins the queue when the tool call returns
            d = self.engines[dest]
            d.es.enqueue(t.tid)
            self._admit(d)
