"""The parts of the SimPy driver every other part uses: its state, timers and event queue.

:class:`DriverCore` holds what the trajectory lifecycle (:mod:`.lifecycle`), the roles and
engines (:mod:`.roles`), the trainer and weight sync (:mod:`.training`) and the recording
(:mod:`.recording`) share; :class:`~rlsched.sim.driver.SimDriver` combines them. They are
split by job, not by layer: each module's methods call the others' through ``self``.

Timers (:mod:`.timers`) are plain objects pushed onto SimPy's queue, not
``simpy.Timeout`` objects with a closure each. The current time is kept in ``self.now``
(set when each timer fires) instead of reading ``env.now`` per use, and the
policy-visible clock (``ClusterState.advance``) is moved only where it is read: before
the policy sees an event and where a trajectory is marked dispatched or finished.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from heapq import heappush
from typing import Any, ClassVar

import simpy

from rlsched.cluster.config import RunConfig
from rlsched.cluster.events import Event
from rlsched.cluster.faults import FaultSchedule
from rlsched.cluster.policy import Policy
from rlsched.cluster.record import RunRecorder
from rlsched.cluster.state import ClusterState

from .cost import CostModel
from .engine import EngineSim
from .gpus import GpuStates
from .timers import NORMAL, Call, queue_of
from .trainer import TrainerSim
from .workload import Batches, Workload

Progress = Callable[[int, int, float], None]  # (steps done, steps, sim time)


@dataclass(slots=True, eq=False)
class SimTraj:
    """Simulator-side state of one trajectory (its turn data only while in flight).

    Identity-hashed (``eq=False``): engines key their batch and KV tables by these
    objects, so the hot path never looks a trajectory up by id. It is also the SimPy event
    of its own tool-call timer (``callbacks``/``_ok``, like :class:`Call`) whenever no
    such timer of it is pending, which saves allocating one object per simulated turn.
    """

    _ok: ClassVar[bool] = True

    tid: str
    widx: int  # index in the workload
    n_turns: int
    truncated: bool
    ts: Any = None  # its ClusterState.TrajState (status, engine, turns_done)
    prompts: list[int] | None = None  # per-turn data while in flight
    outputs: list[int] | None = None
    env_s: list[float] | None = None
    ctx: int = 0  # tokens of finished, kept turns
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
    callbacks: tuple | None = None  # set while it is pending as its own timer event
    timer_token: int = 0  # env_token of that pending timer
    hung: float = 0.0  # its pending tool call hung and is cut after this many seconds
    fault_hits: int = 0  # times a fault stopped it (each time it was dispatched again)

    @property
    def turns_done_kept(self) -> int:
        """Finished, kept turns (its ``TrajState.turns_done``)."""
        return self.ts.turns_done


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
        self.progress = progress
        self.env = simpy.Environment()
        index = workload.index
        self.state = ClusterState(
            config.gpus, config.tp,
            [[(rid, workload.task_ids[index[t]]) for rid, t in b] for b in batches],
            policy.max_staleness,
        )
        self.trajs: dict[str, SimTraj] = {}
        turns, truncated, tstates = workload.turns, workload.truncated, self.state.trajs
        for b in batches:
            for rid, t in b:
                i = index[t]
                self.trajs[rid] = SimTraj(rid, i, int(turns[i]), bool(truncated[i]), tstates[rid])
        self.engines: dict[int, EngineSim] = {}
        self.kv_capacity = cost.kv_capacity_tokens(config.tp)
        self.trainer = TrainerSim()
        self.gpus = GpuStates(config.gpus, recorder)
        self.sandbox_free = config.sandbox_slots
        self.sandbox_queue: deque[SimTraj] = deque()
        self._events: deque[Event] = deque()
        self._pumping = False
        self.events_processed = 0
        self._done = self.env.event()
        self._steps: list[dict] = []
        self._switch_groups: dict[int, list] = {}
        self._group_seq = 0
        self._charge = charge or self._full_context_flops
        self._engine_switch: dict[int, tuple[int, Any]] = {}
        self._callbacks = (self._fire,)
        self._wake_callbacks = (self._wake_timer,)  # the two per-turn timers (lifecycle)
        self._env_callbacks = (self._env_timer,)
        self.now = 0.0  # simulated time of the timer being processed
        self._queue, self._eid = queue_of(self.env)  # see .timers
        self._switch_gid: dict[int, int] = {}  # GPU -> switch group it is switching with
        self.fault = FaultState(faults)  # see .faults

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
        if self._pumping:
            return
        self._pumping = True
        try:
            st = self.state
            st.advance(self.now)
            policy, check, record, apply = self.policy, st.check, self._record_command, self._apply
            while self._events:
                ev = self._events.popleft()
                self.events_processed += 1
                self._record_event(ev)
                for cmd in policy.on_event(ev, st):
                    check(cmd)
                    record(cmd)
                    apply(cmd)
        finally:
            self._pumping = False
