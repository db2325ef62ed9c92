"""The SimPy driver: replays a trace through the cost model under any policy.

The driver owns *timing* only. Roles, lifecycles and the legality of commands live in
:class:`~rlsched.cluster.state.ClusterState` (shared with the live driver); engines are
shared-rate decode servers (:mod:`.engine`); the trainer runs the loop's jobs on the
GPUs in role TRAIN (:mod:`.trainer`). SimPy schedules everything with timers whose callbacks mutate the
state and then deliver the resulting events to the policy, one at a time, in order.
Runs are deterministic: no wall clock, no global RNG, ties broken by insertion order.

:class:`SimDriver` is assembled from one module per job: shared state and timers
(:mod:`.core`), the trajectory lifecycle (:mod:`.lifecycle`), roles and engines
(:mod:`.roles`), the trainer and weight sync (:mod:`.training`) and fault injection
(:mod:`.faults`). What commands mean -- the policy pump, command dispatch, the trainer
queue and the run record's policy rows -- is the driver loop's
(:mod:`rlsched.cluster.loop`), which reaches the simulator through :class:`.backend.SimBackend`.
This module adds running the simulation.
"""

from __future__ import annotations

import gc
import random
import time as wallclock
from dataclasses import dataclass, field

from rlsched.cluster.errors import PolicyError
from rlsched.cluster.events import RunStarted, TimerFired
from rlsched.cluster.state import ClusterState

from .core import Progress
from .faults import FaultMixin
from .lifecycle import Lifecycle
from .memory import below_floor
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


class SimDriver(Lifecycle, Roles, Training, FaultMixin):
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
            self.loop.reset_policy(random.Random(self.cfg.seed))
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
            self.state, now, complete, self.events_processed + self.loop.pumped,
            wallclock.perf_counter() - t0, self.trajs, self.loop.trainer.steps, dict(self.gpus.busy_seconds),
            self._close_faults(),
        )

    def _timer_fired(self, tag: str, _unused: None) -> None:
        self._emit(TimerFired(tag))
