"""The simulator's rollout core: the state the compiled per-turn code uses, and the timers.

The simulated run is composed of collaborators, each owning a stated set of fields (see
each class) and holding references only to the ones it calls (wired by
:class:`~rlsched.sim.driver.SimDriver`):

- :class:`DriverCore` + :class:`~.lifecycle.Lifecycle` (one object, the *rollout core*):
  clock, event heap, trajectories, open engines, sandbox pool, GPU-state record -- the
  compact typed state of the inner loop (``core.pxd``: the per-turn code in :mod:`.turns`
  reads its fields as C members), and the trajectory lifecycle's methods over it;
- :class:`~.roles.Roles`: role switches and their bookkeeping, opening and closing engines;
- :class:`~.training.Training`: the trainer (its GPUs, the running job) and weight sync;
- :class:`~.faults.Faults`: the fault schedule, its effects and their accounting.

The policy event queue, the pump and the trainer queue are the driver loop's
(:mod:`rlsched.cluster.loop`), which reaches these parts through
:class:`~.backend.SimBackend`; the per-turn code reads the loop's event FIFO as
``self._events`` and pumps only when it holds something.

Timers (:mod:`.timers`) are plain objects pushed onto the environment's event queue
(:class:`~.timers.SimEnvironment`, whose public ``heap`` SimPy's ``schedule`` and ``step``
use too), not ``simpy.Timeout`` objects with a closure each; every part schedules through
:meth:`DriverCore.later`. The current time is kept in ``self.now`` (set when each timer
fires) instead of reading ``env.now`` per use, and the policy-visible clock
(``ClusterState.advance``) is moved only where it is read: before the policy sees an
event and where a trajectory is marked dispatched or finished.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial
from heapq import heappop, heappush
from typing import Any

import numpy as np
import simpy

from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import InvariantViolation
from rlsched.cluster.events import Event
from rlsched.cluster.loop import DriverLoop
from rlsched.cluster.policy import Policy
from rlsched.cluster.record import RunRecorder
from rlsched.cluster.state import ClusterState

from .cost import CostModel
from .engine import EngineSim, KvPool
from .gpus import GpuStates
from .timers import NORMAL, Call, SimEnvironment
from .traj import SimTraj
from .workload import Batches, Workload

Progress = Callable[[int, int, float], None]  # (steps done, steps, sim time)


class DriverCore:
    """The rollout core of one simulated run: the state the per-turn code (:mod:`.turns`,
    compiled) reads and writes, and the timers.

    It owns: the clock (``now``) and the event heap (``_queue``/``_eid``, the
    environment's :class:`~.timers.SimEnvironment` heap); the trajectories (``trajs``)
    and the workload's per-turn arrays (``w_prompt``/``w_output``/``w_env``); the open
    engines (``engines``, ``kv_pool``, ``kv_capacity``, ``max_seqs``, ``seq_wait``); the
    sandbox pool (``sandbox_free``, ``sandbox_queue``); the GPU-state record (``gpus``,
    ``gpu_busy`` and the recorder's interval buffers ``iv_*``); and the run's end
    (``done``). The policy-visible store (``state``, a ``ClusterState``) is shared by
    every part and written through its driver API. The trajectory lifecycle's methods are
    :class:`~.lifecycle.Lifecycle`, this class's one subclass.

    It holds references to the collaborators the per-turn code calls on uncommon paths,
    set by :meth:`attach`: ``roles`` (an engine drained empty closes) and ``faults``
    (armed tool hangs), and the driver loop (``loop``; its event FIFO as ``_events``).
    """

    def __init__(
        self,
        workload: Workload,
        batches: Batches,
        policy: Policy,
        config: RunConfig,
        cost: CostModel,
        recorder: RunRecorder | None,
    ) -> None:
        self.cfg = config
        self.cost = cost
        self.rec = recorder
        self.env = SimEnvironment()
        index = workload.index
        self.state = ClusterState(
            config.gpus, config.tp,
            [[(rid, workload.task_ids[index[t]]) for rid, t in b] for b in batches],
            policy.max_staleness,
        )
        self.trajs: dict[str, SimTraj] = {}
        turns, truncated, tstates = workload.turns, workload.truncated, self.state.trajs
        starts = workload.start
        for b in batches:
            for rid, t in b:
                i = index[t]
                self.trajs[rid] = SimTraj(rid, i, int(starts[i]), int(turns[i]), bool(truncated[i]),
                                          tstates[rid])
        # per-turn data, read in place (see SimTraj): typed views when compiled (core.pxd),
        # Python memoryviews (whose items are plain ints and floats) otherwise
        self.w_prompt = memoryview(np.ascontiguousarray(workload.prompt, dtype=np.int64))
        self.w_output = memoryview(np.ascontiguousarray(workload.output, dtype=np.int64))
        self.w_env = memoryview(np.ascontiguousarray(workload.env, dtype=np.float64))
        self.engines: dict[int, EngineSim] = {}
        self.kv_pool = KvPool()  # KV reserved on the active engines (see EngineSim.count_in)
        self.state.use_kv_source(self.kv_pool_total)
        self.kv_capacity = cost.kv_capacity_tokens(config.tp)
        self.gpus = GpuStates(config.gpus, recorder)
        self.gpu_busy = self.gpus.busy  # (typed in core.pxd: engines add to it per turn)
        # the recorder's interval arrays, written per turn by turns.engine_touch
        self.iv_on = recorder is not None
        if recorder is not None:
            (self.iv_first, self.iv_count, self.iv_start, self.iv_end, self.iv_state,
             self.iv_step, self.iv_n) = recorder.interval_buffers()
            self.iv_cap = recorder.flush_rows
        # vLLM's max_num_seqs: sequences an engine decodes at once (the bound's work term
        # assumes it); turns beyond it wait, KV admitted, in seq_wait[engine] (see
        # Lifecycle._join), which holds only engines with a non-empty wait
        self.max_seqs = cost.max_num_seqs
        self.seq_wait: dict[EngineSim, deque] = {}
        self.sandbox_free = config.sandbox_slots
        self.sandbox_queue: deque[SimTraj] = deque()
        self.events_processed = 0  # timers fired (the loop counts the policy events it pumps)
        self.done = self.env.event()
        self._callbacks = (self._fire,)
        # the two per-turn timers (.turns): SimPy calls them with the event only. (Imported
        # here: .turns types its driver argument as this class, so it imports this module.)
        from .turns import env_timer, wake_timer

        self._wake_callbacks = (partial(wake_timer, self),)
        self._env_callbacks = (partial(env_timer, self),)
        self.now = 0.0  # simulated time of the timer being processed
        self._queue, self._eid = self.env.heap, self.env.ids  # (see .timers)

    def attach(self, roles: Any, faults: Any, loop: DriverLoop) -> None:
        """Connect the collaborators the per-turn code calls (see the class doc)."""
        self.roles = roles
        self.faults = faults
        # the contract's meaning (pump, commands, trainer queue, records): rlsched.cluster.loop;
        # its event FIFO is read here directly by the per-turn code (.turns: ``if d._events``)
        self.loop = loop
        self._events: deque[Event] = loop.events

    def close_engine(self, eng: EngineSim) -> None:
        """Engine ``eng`` leaves rollout (drained empty, or lost with a failed GPU): its
        GPUs' interval ends, it fires no more wake-ups, the store forgets it."""
        eng.closed = True
        self.gpus.release(eng)
        eng.wake_at = float("inf")
        del self.engines[eng.id]
        self.state.remove_engine(eng.id)

    def kv_pool_total(self) -> int:
        return self.kv_pool.total

    def _check_kv(self) -> None:
        """(--check) No engine holds more KV than it has: reservations plus the tokens its
        decoding turns generated (computed without advancing the engine)."""
        now = self.now
        for eng in self.engines.values():
            b = len(eng.members)
            p = eng.progress
            start = eng.updated if eng.updated > eng.stall_end else eng.stall_end
            if b and now > start:
                p += (now - start) * eng.rate
            used = eng.kv_reserved - eng.unborn - (eng.target_sum - b * p if b else 0.0)
            if used > eng.kv_capacity * (1 + 1e-6) + 1e-6:
                raise InvariantViolation(f"t={now:.3f}: engine {eng.id} holds {used:.1f} KV tokens, "
                                         f"over its capacity {eng.kv_capacity}")

    # ---------------------------------------------------------------- loop
    def run_until(self, until: simpy.Event) -> None:
        """``env.run(until=until)``, stepping SimPy's queue here: the same events in the
        same order with the same effects as ``Environment.step`` (pop the earliest
        ``(time, priority, id, event)``, set the clock, detach and call the event's
        callbacks, raise a failed event's exception unless it was defused -- read through
        the event's public ``ok``, ``defused`` and ``value``). Compiled
        (``core.pxd``) it spares the Python call ``step`` costs per event; as Python it
        is ``env.run`` without the ``StopSimulation`` callback.

        The simulator's own per-turn timer events (trajectories and engines, typed when
        compiled) are handled without SimPy's attribute protocol: their callbacks are a C
        field, they never fail, their callbacks read the clock from ``self.now`` and never
        schedule through SimPy, and they cannot be ``until`` nor trigger it -- so
        ``env.clock`` is brought up to date only before any other event and on the way out."""
        env = self.env
        queue = self._queue
        if until.callbacks is None:  # (already processed)
            return
        try:
            self._step_until(env, queue, until)
        finally:
            env.clock = self.now

    def _step_until(self, env: simpy.Environment, queue: list, until: simpy.Event) -> None:
        while True:
            if not queue:
                raise RuntimeError(
                    f'No scheduled events left but "until" event was not triggered: {until}')
            now, _, _, event = heappop(queue)
            self.now = now
            cls = type(event)
            if cls is SimTraj:
                t = event
                callbacks = t.callbacks
                t.callbacks = None
                for callback in callbacks:
                    callback(event)
                continue
            if cls is EngineSim:
                eng = event
                callbacks = eng.callbacks
                eng.callbacks = None
                for callback in callbacks:
                    callback(event)
                continue
            env.clock = now
            callbacks = event.callbacks
            event.callbacks = None
            for callback in callbacks:
                callback(event)
            if not event.ok and not event.defused:
                failure = event.value
                exc = type(failure)(*failure.args)
                exc.__cause__ = failure
                raise exc
            if until.callbacks is None:  # (until has been processed)
                return

    # -------------------------------------------------------------- timers
    def later(self, delay: float, fn: Callable[[Any, Any], None], a: Any = None, b: Any = None) -> None:
        """Call ``fn(a, b)`` after ``delay`` simulated seconds (after everything already
        scheduled for that instant)."""
        heappush(self._queue, (self.now + (delay if delay > 0.0 else 0.0), NORMAL, next(self._eid),
                               Call(self._callbacks, fn, a, b)))

    def pending(self) -> int:
        """Timers and events scheduled and not yet processed."""
        return len(self._queue)

    def _fire(self, ev: Call) -> None:
        self.events_processed += 1
        self.now = now = self.env.now
        self.state.advance(now)
        ev.fn(ev.a, ev.b)
        if self._events:
            self.pump()

    # ------------------------------------------------------------- events
    def emit(self, ev: Event) -> None:
        self._events.append(ev)

    def pump(self) -> None:
        self.loop.pump()

    def check_invariants(self) -> None:
        """(--check, before each policy event) The O(1) engine sums policies read are
        right and no engine holds more KV than it has."""
        self.state.check_totals()
        self._check_kv()
