"""The SimPy driver: replays a trace through the cost model under any policy.

The driver owns *timing* only. Roles, lifecycles and the legality of commands live in
:class:`~rlsched.cluster.state.ClusterState` (shared with the live driver); engines are
shared-rate decode servers (:mod:`.engine`); the trainer is a FIFO of jobs
(:mod:`.trainer`). SimPy schedules everything with timers whose callbacks mutate the
state and then deliver the resulting events to the policy, one at a time, in order.
Runs are deterministic: no wall clock, no global RNG, ties broken by insertion order.

:class:`SimDriver` is assembled from one module per job: shared state and timers
(:mod:`.core`), the trajectory lifecycle (:mod:`.lifecycle`), roles and engines
(:mod:`.roles`), the trainer and weight sync (:mod:`.training`), the run record
(:mod:`.recording`) and fault injection (:mod:`.faults`). This module adds running the
simulation and applying commands.
"""

from __future__ import annotations

import gc
import random
import time as wallclock
from dataclasses import dataclass, field

from rlsched.cluster.commands import (
    Command,
    Dispatch,
    Drop,
    Interrupt,
    Move,
    OptimizerStep,
    Reassign,
    SetTimer,
    SyncWeights,
    Train,
    TrainMicroBatch,
)
from rlsched.cluster.errors import PolicyError
from rlsched.cluster.events import RunStarted, TimerFired
from rlsched.cluster.state import ClusterState

from .core import Progress
from .faults import FaultMixin
from .lifecycle import Lifecycle
from .memory import below_floor
from .recording import Recording
from .roles import Roles
from .training import Training
from .traj import SimTraj

__all__ = ["Progress", "SimDriver", "SimResult", "SimTraj"]


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
    faults: dict[str, float] = field(default_factory=dict)  # see sim.core.STAT_KEYS


class SimDriver(Lifecycle, Roles, Training, Recording, FaultMixin):
    """One simulated run of one policy (construct, then :meth:`run` once)."""

    def run(self) -> SimResult:
        """Simulate until every step is trained. Ctrl-C stops the run where it is and
        returns what was simulated so far with ``complete=False``.

        The cyclic garbage collector is paused while it runs: a run allocates a few
        short-lived objects per event (all freed by reference counting -- a whole seed-scale
        run leaves a few dozen cyclic objects) and the collector's passes over the run's
        long-lived state cost ~15% of the time. It is re-enabled (if it was) on return.
        """
        t0 = wallclock.perf_counter()
        complete = True
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            self.policy.reset(self.state, random.Random(self.cfg.seed))
            self._emit(RunStarted())
            self._pump()
            self._arm_faults()
            if not self._done.triggered:
                self._run_until(self._done)
        except RuntimeError as exc:
            if "until" not in str(exc) and "No scheduled events" not in str(exc):
                raise
            raise PolicyError(
                f"policy {self.policy.name} stalled at t={self.env.now:.1f}s: nothing is running "
                f"and only {self.state.version} of {self.state.num_steps} steps are done"
                + below_floor(self.trainer.gpus, self.layout, self.cfg.gpus)
            ) from None
        except KeyboardInterrupt:
            complete = False
        finally:
            if gc_was_enabled:
                gc.enable()
        now = self.env.now
        self.gpus.close_all(now)
        return SimResult(
            self.state, now, complete, self.events_processed,
            wallclock.perf_counter() - t0, self.trajs, self._steps, dict(self.gpus.busy_seconds),
            self._close_faults(),
        )

    def _apply(self, cmd: Command) -> None:
        match cmd:
            case Dispatch(trajectories=tids, engine=e):
                self._dispatch_all(tids, e)
            case Reassign(gpus=gpus, role=role, drain=drain):
                self._reassign(gpus, role, drain)
            case TrainMicroBatch(trajectories=tids):
                self._queue_micro_batch(tids)
                self._trainer_next()
            case Train(trajectories=tids):
                self._queue_micro_batch(tids)
                self._queue_optimizer_step()
                self._trainer_next()
            case OptimizerStep():
                self._queue_optimizer_step()
                self._trainer_next()
            case SyncWeights(engines=es):
                self._sync(es if es is not None else self.state.engines())
            case Interrupt(trajectories=tids, keep_progress=keep):
                for tid in tids:
                    self._interrupt(self.trajs[tid], keep)
            case Move(trajectories=tids, engine=e):
                self._move_all(tids, e)
            case Drop(trajectories=tids):
                for tid in tids:
                    t = self.trajs[tid]
                    t.wasted += t.output_kept
                self.state.mark_dropped(tids)
            case SetTimer(at=at, tag=tag):
                self._later(at - self.now, self._timer_fired, tag)

    def _timer_fired(self, tag: str, _unused: None) -> None:
        self._emit(TimerFired(tag))
