"""The parts of the SimPy driver every other part uses: its state, timers and event queue.

:class:`DriverCore` holds what the trajectory lifecycle (:mod:`.lifecycle`), the roles and
engines (:mod:`.roles`) and the trainer and weight sync (:mod:`.training`) share;
:class:`~rlsched.sim.driver.SimDriver` combines them. They are split by job, not by
layer: each module's methods call the others' through ``self``. The policy event queue,
the pump and the trainer queue are the driver loop's (``self.loop``,
:mod:`rlsched.cluster.loop`); the per-turn code reads the loop's event FIFO as
``self._events`` and pumps only when it holds something.

Timers (:mod:`.timers`) are plain objects pushed onto the environment's event queue
(:class:`~.timers.SimEnvironment`, whose public ``heap`` SimPy's ``schedule`` and ``step``
use too), not ``simpy.Timeout`` objects with a closure each. The current time is kept in
``self.now`` (set when each timer fires) instead of reading ``env.now`` per use, and the
policy-visible clock (``ClusterState.advance``) is moved only where it is read: before
the policy sees an event and where a trajectory is marked dispatched or finished.
"""

from __future__ import annotations

import random
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
from rlsched.cluster.faults import FaultSchedule
from rlsched.cluster.loop import DriverLoop
from rlsched.cluster.policy import Policy
from rlsched.cluster.record import RunRecorder
from rlsched.cluster.state import ClusterState

from .backend import SimBackend
from .cost import CostModel
from .engine import EngineSim, KvPool
from .gpus import GpuStates
from .memory import trainer_floor
from .timers import NORMAL, Call, SimEnvironment
from .trainer import TrainerSim
from .traj import SimTraj
from .workload import Batches, Workload

Progress = Callable[[int, int, float], None]  # (steps done, steps, sim time)


STAT_KEYS = (
    "faults",  # faults fired (explicit and rate)
    "gpu", "trainer", "tool", "sync",  # of which, per kind
    "without_effect",  # fired but hit nothing (GPU already failed, trainer not running...)
    "trajectory_interruptions",  # trajectories stopped by a fault (one can be hit twice)
    "retried_trajectories",  # distinct trajectories stopped by a fault (set at run end)
    "wasted_tokens",  # generated tokens of turns in progress that faults threw away
    "train_gpu_seconds_lost",  # trainer work re-run + trainer GPUs waiting for a restart
    "sync_gpu_seconds_lost",  # GPU time of weight syncs that failed
    "tool_seconds_lost",  # extra tool-call seconds of hung calls (limit - recorded time)
    "failed_gpu_seconds",  # GPU-seconds GPUs spent failed
    "armed_never_hit",  # tool/sync faults still waiting for a call/sync at run end
)


class FaultState:
    """Per-run fault bookkeeping (:mod:`.faults` fires the schedule and applies the effects)."""

    def __init__(self, schedule: FaultSchedule | None) -> None:
        self.schedule = schedule
        self.stats: dict[str, float] = dict.fromkeys(STAT_KEYS, 0)
        self.hangs: list[str | None] = []  # armed tool hangs (target trajectory, or None: any)
        self.sync_fails = 0  # armed weight-sync failures
        self.fail_since: dict[int, float] = {}
        self.fail_token: dict[int, int] = {}
        self.rate_timers = 0
        self.progress_mark: tuple[int, int] = (-1, -1)  # (version, turns done) at the last check
        self.since_mark = 0  # faults fired since then
        self.rng = random.Random(schedule.seed if schedule else 0)


class DriverCore:
    """Shared state of one simulated run, plus timers and the policy event queue."""

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
        faults: FaultSchedule | None = None,
    ) -> None:
        self.w = workload
        self.policy = policy
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
        self.trainer = TrainerSim()
        self.layout = trainer_floor(self.state, cost, config.tp, self.kv_capacity)  # (see .memory)
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
        self._done = self.env.event()
        self._switch_groups: dict[int, list] = {}
        self._group_seq = 0
        self._charge = charge or self._full_context_flops
        self._engine_switch: dict[int, tuple[int, Any]] = {}
        self._callbacks = (self._fire,)
        # the two per-turn timers (.turns): SimPy calls them with the event only. (Imported
        # here: .turns types its driver argument as this class, so it imports this module.)
        from .turns import env_timer, wake_timer

        self._wake_callbacks = (partial(wake_timer, self),)
        self._env_callbacks = (partial(env_timer, self),)
        self.now = 0.0  # simulated time of the timer being processed
        self._queue, self._eid = self.env.heap, self.env.ids  # (see .timers)
        self._switch_gid: dict[int, int] = {}  # GPU -> switch group it is switching with
        self.fault = FaultState(faults)  # see .faults
        # the contract's meaning (pump, commands, trainer queue, records): rlsched.cluster.loop;
        # its event FIFO is read here directly by the per-turn code (.turns: ``if d._events``)
        self.loop = DriverLoop(self.state, policy, SimBackend(self), recorder, progress=progress,  # type: ignore[arg-type]
                               before_event=self._check_invariants if config.check else None,
                               guard_view=config.check)
        self._events: deque[Event] = self.loop.events

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
    def _run_until(self, until: simpy.Event) -> None:
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
    def _later(self, delay: float, fn: Callable[[Any, Any], None], a: Any = None, b: Any = None) -> None:
        """Call ``fn(a, b)`` after ``delay`` simulated seconds (after everything already
        scheduled for that instant)."""
        heappush(self._queue, (self.now + (delay if delay > 0.0 else 0.0), NORMAL, next(self._eid),
                               Call(self._callbacks, fn, a, b)))

    def _fire(self, ev: Call) -> None:
        self.events_processed += 1
        self.now = now = self.env.now
        self.state.advance(now)
        ev.fn(ev.a, ev.b)
        if self._events:
            self._pump()

    # ------------------------------------------------------------- events
    def _emit(self, ev: Event) -> None:
        self._events.append(ev)

    def _pump(self) -> None:
        self.loop.pump()

    def _check_invariants(self) -> None:
        """(--check, before each policy event) The O(1) engine sums policies read are
        right and no engine holds more KV than it has."""
        self.state.check_totals()
        self._check_kv()
