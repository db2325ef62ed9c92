"""Trajectory lifecycle in the simulator: dispatch, admission under KV capacity, turns
(prefill + shared-rate decode), tool time with sandbox slots, finish, interrupt, migration.

Binding (see ``Dispatch`` and ``Move``): a pinned trajectory waits in its engine's queue
and runs there; an unpinned one waits in the cluster queue (``ClusterState.unbound``)
until an engine on which it fits admits it (:meth:`Lifecycle._place_all` when work joins
the queue, :meth:`Lifecycle._admit` when an engine frees room), and goes back to the
queue's head when its engine has no room for its next turn. Every engine decodes at most
``max_num_seqs`` sequences; further admitted turns wait for a slot (:meth:`_join`).

The two timers every simulated turn fires (an engine wake-up when a decode ends, a
tool-call return) are the inner loop and live in :mod:`.turns`; they call the methods
here on their uncommon paths. These methods work on :class:`~rlsched.sim.traj.SimTraj`
and :class:`~rlsched.sim.engine.EngineSim` objects rather than ids, and touch ids only
where the policy-visible ``ClusterState`` needs them: a trajectory's placement there is
written only through its driver API (``mark_dispatched``, ``mark_running``,
``mark_queued``, ``mark_finished``, ``enqueue_unbound``/``take_unbound``...).

:class:`Lifecycle` is the rollout core's behaviour over :class:`~.core.DriverCore`'s
fields -- one object, split so that the fields the inner loop reads can be compiled
(``core.pxd``); the roles, training and faults are separate collaborators (see
:mod:`.core`) and call only the public methods listed on the class.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from heapq import heapify, heappush, heapreplace

from rlsched.cluster.events import TrajectoryFinished
from rlsched.cluster.ids import Drain, GpuState, TrajStatus
from rlsched.cluster.state import EngineState

from .core import DriverCore
from .engine import EngineSim
from .gpus import CODE
from .timers import NORMAL, Call
from .traj import SimTraj
from .turns import engine_touch

_INF = float("inf")
_RUNNING = TrajStatus.RUNNING
_INTERRUPTED = TrajStatus.INTERRUPTED
_TIMED_OUT = TrajStatus.TIMED_OUT
_DONE = TrajStatus.DONE
_GENERATE = GpuState.GENERATE


class Lifecycle(DriverCore):
    """The rollout core's methods (its fields are :class:`~.core.DriverCore`'s): they
    move trajectories along on the open engines.

    Public, for the backend and the other collaborators: :meth:`dispatch`, :meth:`move`,
    :meth:`interrupt`, :meth:`drop` (the commands), :meth:`open_engine` and
    :meth:`evacuate` (for :class:`~.roles.Roles`), :meth:`strand_unbound` (roles and
    faults) and :meth:`engine_touch`. The per-turn code (:mod:`.turns`) calls the
    underscored ones on its uncommon paths."""

    # ------------------------------------------------------------ commands
    def dispatch(self, tids: Sequence[str], e: int | None) -> None:
        """``Dispatch``: pinned to engine ``e``, or (None) into the cluster queue, which
        is then placed: each on the least-loaded engine (running + queued, engine id) on
        which it fits (see :meth:`_place_all`)."""
        trajs = self.trajs
        if e is not None:
            eng = self.engines[e]
            for tid in tids:
                self._dispatch(trajs[tid], eng)
            return
        if not tids:
            return
        if not self.state.engines():
            self.state.least_loaded()  # raises the PolicyError for "no rollout engine"
        for tid in tids:
            self._dispatch_unbound(trajs[tid])
        self._place_all()

    def interrupt(self, tid: str, keep: bool) -> None:
        """``Interrupt`` (and a fault's or a drain's stop): ``tid`` stops, its finished
        turns kept if ``keep``."""
        self._interrupt(self.trajs[tid], keep)

    def drop(self, tids: Sequence[str]) -> None:
        """``Drop``: the kept tokens of ``tids`` will never be trained."""
        trajs = self.trajs
        for tid in tids:
            t = trajs[tid]
            t.wasted += t.output_kept

    def strand_unbound(self) -> None:
        """No active rollout engine is left: the cluster queue's trajectories stop, their
        finished turns kept (as those on a drained engine's queue), for the policy to
        dispatch again once engines are back."""
        st = self.state
        while st.unbound:
            self._interrupt(self.trajs[st.unbound[0]], keep=True)

    # ------------------------------------------------------------- engines
    def place_waiting(self) -> None:
        """Admit what waits in the cluster queue where it may now go (an engine's weights
        were updated: work its old ones could not take)."""
        self._place_all()

    def open_engine(self, e: int, v: int) -> None:
        """Engine ``e``'s GPUs finished switching to rollout: it opens with weights ``v``
        (the trainer's version when the switch started)."""
        if e in self.engines:
            # Called once per GPU of the engine whose switch ends (all at one instant): the
            # first call opens it; later ones keep it. (Replacing it would drop trajectories
            # a policy dispatched to it in between, e.g. on its EngineIdle.)
            return
        gpus = self.state.engine_gpus(e)
        es = EngineState(e, gpus, v, self.kv_capacity)
        self.state.add_engine(es)
        eng = EngineSim(e, gpus[0], self.cfg.tp, self.cost, self.kv_capacity, version=v, es=es)
        eng.updated = eng.stall_end = self.now
        eng.queue, eng.eid, eng.wake_callbacks = self._queue, self._eid, self._wake_callbacks
        eng.count_in(self.kv_pool)
        # An engine opens once per GPU of it whose switch ends (all at one instant); it
        # reports EngineIdle only if its GPUs were not already idle rollout.
        eng.gstate = GpuState(self.gpus.state_of(gpus[0]))
        eng.gcode = CODE[eng.gstate]
        self.engines[e] = eng
        self._admit(eng)  # (takes work waiting in the cluster queue; reports EngineIdle else)

    def evacuate(self, eng: EngineSim, drain: Drain) -> None:
        """Engine ``eng`` (draining: it leaves rollout) gives up its trajectories as
        ``drain`` says: interrupted, or moved to the cluster queue's head (queued ones and
        those in tool time; running ones too with ``MIGRATE``), keeping their order."""
        es = eng.es
        others = [x for x in self.state.engines_.values() if not x.draining]
        if drain is not Drain.INTERRUPT and not others and (es.running or es.queue):
            drain = Drain.INTERRUPT  # nowhere to migrate to: keep progress, stop here
        trajs = self.trajs
        if not others:
            self.strand_unbound()
        members = list(es.queue) + sorted(es.running)
        if drain is Drain.INTERRUPT:
            for tid in members:
                self._interrupt(trajs[tid], keep=True)
        else:
            # to the cluster queue's head, keeping their order there
            queued = set(es.queue)
            moving = [tid for tid in members
                      if drain is Drain.MIGRATE or tid in queued or trajs[tid].in_env]
            for tid in reversed(moving):
                self._move(trajs[tid], eng, None)
            if moving:
                self._place_all()

    def engine_touch(self, eng: EngineSim) -> None:
        """Recompute the engine's GPU state after a change; report an idle engine."""
        engine_touch(self, eng)

    # ---------------------------------------------------------- dispatch
    def _dispatch(self, t: SimTraj, eng: EngineSim) -> None:
        """``Dispatch`` to engine ``eng``: pinned there."""
        st = self.state
        st.advance(self.now)
        ts = t.ts
        st.mark_dispatched(t.tid, eng.id)
        if t.in_env:
            return  # interrupted in a tool call that still runs: it queues when the call returns
        if ts.turns_done == t.n_turns:  # interrupted in its last tool call, which has returned
            self._complete(t, eng.id)
            return
        eng.es.enqueue(t.tid)
        self._admit(eng)

    def _dispatch_unbound(self, t: SimTraj) -> None:
        """``Dispatch`` without an engine: into the cluster queue (the caller then places
        the queue with :meth:`_place_all`)."""
        st = self.state
        st.advance(self.now)
        ts = t.ts
        last = ts.engine
        st.mark_dispatched(t.tid, None)
        if t.in_env:
            return  # interrupted in a tool call that still runs: it queues when the call returns
        if ts.turns_done == t.n_turns:  # interrupted in its last tool call, which has returned
            self._complete(t, -1 if last is None else last)
            return
        st.enqueue_unbound(t.tid)

    def _need(self, t: SimTraj) -> int:
        """KV tokens ``t``'s next turn holds at its end: context, the turn's prompt and
        output (a turn that cannot fit an empty engine times out)."""
        row = t.first + t.ts.turns_done
        return t.ctx + self.w_prompt[row] + self.w_output[row]

    def _pending(self, t: SimTraj) -> int:
        """Tokens ``t``'s next turn has still to generate."""
        return self.w_output[t.first + t.ts.turns_done] - t.turn_progress

    def _prompt_need(self, t: SimTraj) -> int:
        """KV tokens admission reserves for ``t``'s next turn: its context, the turn's
        prompt and what it generated of the turn before it left an engine (the tokens it
        generates are counted as they grow: ``EngineSim.used``)."""
        return t.ctx + self.w_prompt[t.first + t.ts.turns_done] + t.turn_progress

    def _fits(self, eng: EngineSim, need: int) -> bool:
        """``need`` KV tokens fit in ``eng``'s free KV now. (The cluster queue is placed
        into free room only: evicting other trajectories' idle contexts to place it would
        send them, on return, to the queue in turn -- a cascade of re-prefills.)"""
        return need <= eng.free(self.now)

    def _admit(self, eng: EngineSim) -> None:
        """Start queued trajectories while the engine's KV cache has room: its own queue
        first (FIFO), then the cluster queue's head while it fits here."""
        es = eng.es
        queue = es.queue
        trajs = self.trajs
        mark_running = self.state.mark_running
        while queue and not es.draining:
            t = trajs[queue[0]]
            if self._need(t) > eng.kv_capacity:
                es.dequeue(admit=False)
                self._finish(t, _TIMED_OUT, eng.id, note="context exceeds KV capacity")
                continue
            pending = self._pending(t)
            if not eng.reserve(t, self._need(t), pending, self.now):
                break
            t.pending_out = pending
            if eng.evicted:
                self._drain_evictions(eng)
            es.dequeue(admit=True)
            mark_running(t.tid, eng.id)
            self._start_turn(t, eng)
        st = self.state
        unbound = st.unbound
        if unbound and not queue and not es.draining and not eng.closed:
            while unbound:
                # the first this engine's weights may generate (ClusterState.may_bind): the
                # queue's head but for an engine with older weights than the rest
                tid = st.first_bindable(es.version)
                if tid is None:
                    break
                t = trajs[tid]
                if self._need(t) > eng.kv_capacity:
                    self._too_long(t)
                    continue
                need = self._prompt_need(t)
                if not self._fits(eng, need):
                    break
                self._admit_unbound(t, eng, need)
        self.engine_touch(eng)

    def _too_long(self, t: SimTraj) -> None:
        """The head of the cluster queue fits on no engine (its next turn outgrows an
        empty engine's KV): it times out, as on an engine's own queue."""
        self.state.take_unbound(t.tid)
        self._finish(t, _TIMED_OUT, -1, note="context exceeds KV capacity")

    def _admit_unbound(self, t: SimTraj, eng: EngineSim, need: int) -> None:
        """Admit the cluster queue's head ``t`` on ``eng`` (where it fits) and start its turn."""
        pending = self._pending(t)
        eng.reserve(t, self._need(t), pending, self.now)
        t.pending_out = pending
        if eng.evicted:
            self._drain_evictions(eng)
        st = self.state
        st.take_unbound(t.tid)
        eng.es.admit(t.tid)
        st.mark_running(t.tid, eng.id)
        self._start_turn(t, eng)

    def _place_all(self) -> None:
        """Admit the cluster queue, head first, each on the least-loaded active engine
        (running + queued, lowest id) on which it fits and whose weights it may be
        generated by (``ClusterState.may_bind``); stop at the first that fits nowhere it may
        go (FIFO, as an engine's own queue). One that no engine up may take (their weights
        too old for its step) waits without holding up the rest."""
        st = self.state
        unbound = st.unbound
        if not unbound:
            return
        engines = self.engines
        heap = [(load, e) for e, load in st.engine_loads()]
        heapify(heap)
        trajs = self.trajs
        skipped: list[str] = []  # (waiting for an engine with recent enough weights)
        while unbound and heap:
            t = trajs[unbound[0]]
            if self._need(t) > self.kv_capacity:
                self._too_long(t)
                continue
            need = self._prompt_need(t)
            eng = engines[heap[0][1]]
            if not self._fits(eng, need) or not st.may_bind(t.tid, eng.es.version):
                eng, allowed = None, False
                for _, e in sorted(heap):
                    if st.may_bind(t.tid, engines[e].es.version):
                        allowed = True
                        if self._fits(engines[e], need):
                            eng = engines[e]
                            break
                if eng is None:
                    if allowed:
                        break  # (room nowhere it may go: FIFO, it waits at the head)
                    skipped.append(unbound.popleft())  # (no engine it may go to: the rest go on)
                    continue
            self._admit_unbound(t, eng, need)
            self.engine_touch(eng)
            if eng.id == heap[0][1]:
                heapreplace(heap, (eng.es.load, eng.id))
            else:
                heap = [(eng.es.load, e) if e == eng.id else (load, e) for load, e in heap]
                heapify(heap)
        if skipped:
            unbound.extendleft(reversed(skipped))  # (back at the head, in their order)

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
                secs, by_prefill = self.cost.migrate_s(self.cfg.tp, held,
                                                       self._kv_local(t.moved_from, eng.first_gpu))
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
        t.prefill_end = _INF  # (until it joins a decode batch: see _move)
        if t.turn_progress == 0 or eng.version < t.turn_version:  # (see SimTraj.turn_version)
            t.turn_version = eng.version
        if delay > 0.0:
            # KV still in transit: the trajectory waits; the engine is not blocked.
            self.later(delay, self._join_after_transfer, t, (eng.id, new, cached, t.join_token))
            return False
        if len(eng.members) >= self.max_seqs:
            self._wait_seq(t, eng, new, cached)
            return False
        t.prefill_end = eng.join(self.now, t, cached, new, self.w_output[t.first + t.ts.turns_done] - t.turn_progress)
        self.engine_touch(eng)
        eng.rearm(self.now)
        return True

    def _kv_local(self, src: int, dst: int) -> bool:
        """Does a context move from the engine at GPU ``src`` to the one at ``dst`` stay in
        NVLink domains? KV shard ``i`` goes from GPU ``src+i`` to ``dst+i``; the transfer is
        as slow as its slowest shard, so it is local only when every pair shares a domain
        (weight sync decides by where the GPUs are the same way). Flat fabric, or a source
        not known: not local (``migrate_s`` then uses ``kv_transfer_bw`` or the NICs)."""
        n = self.cost.gpus_per_node
        if n <= 0 or src < 0:
            return False
        return all((src + i) // n == (dst + i) // n for i in range(self.cfg.tp))

    def _join_after_transfer(self, t: SimTraj, args: tuple[int, int, int, int]) -> None:
        e, new, cached, token = args
        ts = t.ts
        if token != t.join_token or ts.engine != e or ts.status is not _RUNNING:
            return  # moved or interrupted while its KV was in transit
        self._join(t, self.engines[e], new, cached)

    def _join(self, t: SimTraj, eng: EngineSim, new: int, cached: int) -> None:
        """``t`` (admitted, KV reserved) joins the decode batch, or waits for one of the
        engine's ``max_num_seqs`` slots."""
        if len(eng.members) >= self.max_seqs:
            self._wait_seq(t, eng, new, cached)
            return
        t.prefill_end = eng.join(self.now, t, cached, new, self.w_output[t.first + t.ts.turns_done] - t.turn_progress)
        self.engine_touch(eng)
        eng.rearm(self.now)

    def _wait_seq(self, t: SimTraj, eng: EngineSim, new: int, cached: int) -> None:
        """The engine decodes ``max_num_seqs`` sequences: ``t`` waits for a slot, FIFO.
        Its KV is reserved, so the decoding turns now fill the engine sooner: the wake-up
        that relieves a full engine is re-armed (without it the engine ran over its
        capacity until its next batch change)."""
        wait = self.seq_wait.get(eng)
        if wait is None:
            wait = self.seq_wait[eng] = deque()
        wait.append((t, new, cached))
        eng.rearm(self.now)

    def _resume_seq(self, eng: EngineSim) -> None:
        """Slots freed on ``eng``: turns waiting for one join, oldest first."""
        wait = self.seq_wait[eng]
        cap = self.max_seqs
        now = self.now
        while wait and len(eng.members) < cap:
            t, new, cached = wait.popleft()
            if t.turn_progress == 0 or eng.version < t.turn_version:
                t.turn_version = eng.version
            t.prefill_end = eng.join(now, t, cached, new, self.w_output[t.first + t.ts.turns_done] - t.turn_progress)
        if not wait:
            del self.seq_wait[eng]
        self.engine_touch(eng)
        eng.rearm(now)

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
        """Moved off its engine during tool time: join the queue of the engine it is pinned
        to, else (unpinned, or that engine has since left rollout) the cluster queue's head."""
        ts = t.ts
        e = ts.engine
        if ts.turns_done == t.n_turns:  # that was its last tool call: done, no engine needed
            self._complete(t, -1 if e is None else e)
            return
        st = self.state
        es = st.engines_.get(e) if ts.pinned else None
        if es is None or es.draining:
            if not st.engines():
                self._finish(t, _INTERRUPTED, -1 if e is None else e, note="no rollout engine left")
                return
            st.enqueue_unbound(t.tid, front=True)
            self._place_all()
            return
        eng = self.engines[e]
        eng.es.enqueue(t.tid)
        self._admit(eng)

    def _wait_for_kv(self, t: SimTraj, eng: EngineSim) -> None:
        """No room for ``t``'s next turn even after evicting idle contexts: a pinned
        trajectory waits at the head of its engine's queue; an unpinned one goes to the
        head of the cluster queue, its context leaving the engine now (moved or
        re-prefilled where it is admitted next, see ``_start_turn``)."""
        self._drain_evictions(eng)
        eng.release(t)
        had_kv = t.kv_cached
        t.kv_cached = False
        es = eng.es
        es.discard(t.tid)
        ts = t.ts
        self.state.mark_queued(t.tid, ts.engine, pinned=ts.pinned)
        if ts.pinned:
            es.enqueue(t.tid, front=True)
            self.engine_touch(eng)
            return
        if had_kv:
            t.moved_at = self.now
            t.moved_from = eng.first_gpu
        if self.rec is not None:
            self.rec.event(self.now, "Requeue", engine=eng.id, trajectory=t.tid,
                           detail=f"{t.ctx} tokens of context")
        self.state.enqueue_unbound(t.tid, front=True)
        self.engine_touch(eng)
        self._place_all()

    def _relieve(self, eng: EngineSim) -> None:
        """The turns ``eng`` decodes have filled its KV: as vLLM, free cached idle
        contexts (oldest first), then preempt the most recently admitted sequences --
        waiting for a decode slot first, then decoding -- until the rest fit."""
        now = self.now
        lru = eng.env_lru
        requeued = False
        while eng.overflowing(now):
            if lru:
                eng.evict(next(iter(lru)))
                continue
            wait = self.seq_wait.get(eng)
            if wait:
                t = wait[-1][0]
            elif eng.members:
                t = next(reversed(eng.members))
            else:
                break
            requeued = self._preempt(t, eng) or requeued
        if eng.evicted:
            self._drain_evictions(eng)
        self.engine_touch(eng)
        if requeued:
            self._place_all()

    def _preempt(self, t: SimTraj, eng: EngineSim) -> bool:
        """Recompute-preemption: ``t`` leaves ``eng`` keeping the tokens it generated, its
        KV freed; it waits at the head of its engine's queue (pinned) or of the cluster
        queue (True), and its context is prefilled again where it is admitted next."""
        ts = t.ts
        self._detach(t, eng)
        t.kv_cached = False
        t.moved_at = -1.0
        self.state.mark_queued(t.tid, ts.engine, pinned=ts.pinned)
        if self.rec is not None:
            self.rec.event(self.now, "Preempt", engine=eng.id, trajectory=t.tid,
                           detail=f"{t.ctx + t.turn_progress} tokens")
        if ts.pinned:
            eng.es.enqueue(t.tid, front=True)
            return False
        self.state.enqueue_unbound(t.tid, front=True)
        return True

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
            if self.faults.hangs:
                env_s = self.faults.hang(u, env_s)
            self._env_later(u, env_s, u.env_token)

    # ------------------------------------------------------ leaving engines
    def _finish(self, t: SimTraj, status: TrajStatus, e: int, note: str = "") -> None:
        """``t`` stops generating (``e``: the engine it was last on, -1 if none)."""
        t.kv_cached = False
        self.state.advance(self.now)
        self.state.mark_finished(t.tid, status)
        if note and self.rec is not None:
            self.rec.event(self.now, "Note", trajectory=t.tid, engine=e, detail=note)
        self.emit(TrajectoryFinished(t.tid, status, e))

    def _interrupt(self, t: SimTraj, keep: bool) -> None:
        ts = t.ts
        e = ts.engine
        eng = self.engines.get(e) if e is not None else None
        in_env = t.in_env
        if eng is not None:
            self._detach(t, eng)
        elif e is None:
            self.state.take_unbound(t.tid)
            e = -1
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
            self.state.reset_progress(t.tid)
        self._finish(t, _INTERRUPTED, e)
        if eng is not None and not eng.closed:
            self._admit(eng)

    def _detach(self, t: SimTraj, eng: EngineSim) -> None:
        """Take ``t`` off engine ``eng`` (decode batch, queue, KV), keeping turn progress."""
        es = eng.es
        t.join_token += 1  # cancels a pending KV-transfer join
        if t in eng.members:
            t.pending_out = 0  # (moved from unborn at its join)
            produced = eng.leave(self.now, t, self.w_output[t.first + t.ts.turns_done] - t.turn_progress)
            t.turn_progress += produced
            t.generated += produced
            if eng in self.seq_wait:
                self._resume_seq(eng)
            eng.rearm(self.now)
        else:
            if t.pending_out:  # admitted, not decoding yet (a slot, its KV in transit)
                eng.unborn -= t.pending_out
                t.pending_out = 0
            if eng in self.seq_wait:  # waiting for a decode slot
                wait = self.seq_wait[eng]
                for entry in wait:
                    if entry[0] is t:
                        wait.remove(entry)
                        break
                if not wait:
                    del self.seq_wait[eng]
        es.discard(t.tid)
        eng.env_lru.pop(t, None)
        eng.release(t)

    def _move_out(self, t: SimTraj, eng: EngineSim) -> None:
        """Migrate ``t`` off engine ``eng``, which leaves rollout, to the head of the
        cluster queue, unpinned (or, if a failure left no engine, stop it with its
        finished turns kept)."""
        if not self.state.engines():
            self._interrupt(t, keep=True)
            return
        self._move(t, eng, None)
        self._place_all()

    def _move(self, t: SimTraj, eng: EngineSim | None, dest: int | None) -> None:
        """``Move`` one trajectory (queued or running; ``eng``: its engine, None in the
        cluster queue) to engine ``dest`` (pinned) or, with None, to the head of the
        cluster queue (unpinned). Its context leaves ``eng`` now: ``_start_turn`` charges
        the transfer (from ``moved_at``) or the re-prefill on the engine that admits it.
        The caller admits: ``_admit(dest)``, :meth:`_place_all` and ``_admit(eng)`` (the
        room it left)."""
        st = self.state
        if eng is not None and dest == eng.id:  # unpinned and already there: pin it
            st.pin(t.tid)
            return
        migrated = False
        if eng is None:
            st.take_unbound(t.tid)
        else:
            # (context resident here, or a turn in progress whose KV is not still in
            # transit from an earlier move: that one keeps its moved_at)
            had_kv = t.kv_cached or (t.mid_turn and t.moved_at < 0)
            self._detach(t, eng)
            t.kv_cached = False
            if t.mid_turn and t.turn_progress == 0 and self.now < t.prefill_end:
                # The turn's prompt is not prefilled yet (it waits for a decode slot or its
                # KV, or the engine's prefill stall has not reached it): it goes with the
                # context before the turn and is prefilled where the trajectory lands. (It
                # was carried as held KV: moved in the instant it joined, a trajectory
                # skipped its prefill and a run beat its lower bound, hunt seed 2073.)
                t.mid_turn = False
            if had_kv:
                t.moved_at = self.now
                t.moved_from = eng.first_gpu
                migrated = True
                if self.rec is not None:
                    self.rec.event(self.now, "Migrate", engine=-1 if dest is None else dest,
                                   trajectory=t.tid, detail=f"from {eng.id}")
        st.mark_queued(t.tid, dest, pinned=dest is not None, migrated=migrated)
        if t.in_env:
            return  # in tool time it joins when the tool call returns
        if dest is None:
            st.enqueue_unbound(t.tid, front=True)
        else:
            self.engines[dest].es.enqueue(t.tid)

    def move(self, tids: Sequence[str], dest: int | None) -> None:
        """The ``Move`` command: each of ``tids`` in turn, then admission where they went.
        (Sent to the cluster queue, they keep their order at its head.)"""
        trajs, engines = self.trajs, self.engines
        order = reversed(tids) if dest is None else tids
        left: dict[int, None] = {}
        for tid in order:
            t = trajs[tid]
            e = t.ts.engine
            eng = engines.get(e) if e is not None else None
            self._move(t, eng, dest)
            if eng is not None and e != dest:
                left[e] = None
        if dest is not None:
            self._admit(engines[dest])
        self._place_all()
        for e in left:
            eng = engines.get(e)
            if eng is not None and not eng.closed and not eng.es.draining:
                self._admit(eng)
