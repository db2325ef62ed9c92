"""The SimPy driver: replays a trace through the cost model under any policy.

The driver owns *timing* only. Roles, lifecycles and the legality of commands live in
:class:`~rlsched.cluster.state.ClusterState` (shared with the live driver); engines are
shared-rate decode servers (:mod:`.engine`); the trainer runs the loop's jobs on the
GPUs in role TRAIN (:mod:`.trainer`). SimPy schedules everything with timers whose callbacks mutate the
state and then deliver the resulting events to the policy, one at a time, in order.
Runs are deterministic: no wall clock, no global RNG, ties broken by insertion order.

:class:`SimDriver` is the composition root of one run: it builds the collaborators, each
owning a stated set of fields and holding references only to those it calls (see
:mod:`.core` for the list) -- the rollout core (clock, event heap, trajectories, engines:
:class:`~.lifecycle.Lifecycle` over the compiled :class:`~.core.DriverCore`), the roles
(:class:`~.roles.Roles`), the trainer and weight sync (:class:`~.training.Training`) and
fault injection (:class:`~.faults.Faults`) -- and wires them to the driver loop
(:mod:`rlsched.cluster.loop`: the policy pump, command dispatch, the trainer queue and
the run record's policy rows), which reaches them through :class:`.backend.SimBackend`.
This module adds running the simulation.
"""

from __future__ import annotations

import gc
import random
import time as wallclock
from collections.abc import Callable
from dataclasses import dataclass, field

from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import PolicyError
from rlsched.cluster.events import RunStarted
from rlsched.cluster.faults import FaultSchedule
from rlsched.cluster.loop import DriverLoop
from rlsched.cluster.policy import Policy
from rlsched.cluster.record import RunRecorder
from rlsched.cluster.state import ClusterState

from .backend import SimBackend
from .core import Progress
from .cost import CostModel
from .faults import Faults
from .lifecycle import Lifecycle
from .memory import below_floor
from .roles import Roles
from .training import Training
from .traj import SimTraj
from .workload import Batches, Workload

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
    # GPU-seconds per GPU state (a GpuState value; states never entered left out), summed as
    # the intervals are written, so no record is needed (rlsched plan's utilization reads it)
    gpu_seconds: dict[str, float] = field(default_factory=dict)
    faults: dict[str, float] = field(default_factory=dict)  # see sim.faults.STAT_KEYS


class SimDriver:
    """One simulated run of one policy (construct, then :meth:`run` once).

    Holds the collaborators (``core``, ``roles``, ``training``, ``faults``), the driver
    loop (``loop``) and the policy; ``state`` and ``trajs`` are the core's."""

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
        self.policy = policy
        self.cfg = config
        core = self.core = Lifecycle(workload, batches, policy, config, cost, recorder)
        self.training = Training(core, charge)
        self.roles = Roles(core, self.training)
        self.faults = Faults(faults, core, self.roles, self.training)
        # the contract's meaning (pump, commands, trainer queue, records)
        self.loop = DriverLoop(core.state, policy, SimBackend(core, self.roles, self.training),  # type: ignore[arg-type]
                               recorder, progress=progress,
                               before_event=core.check_invariants if config.check else None,
                               guard_view=config.check)
        core.attach(self.roles, self.faults, self.loop)
        self.training.attach(self.loop.trainer, self.faults)
        self.roles.attach(self.loop.trainer)
        self.state: ClusterState = core.state
        self.trajs: dict[str, SimTraj] = core.trajs

    def start(self) -> None:
        """The run's start, without running it: the policy's ``reset`` and its decision on
        ``RunStarted``, its commands legality-checked and applied; no simulated time passes.
        ``rlsched compare`` makes each spec's start before any run (a spec that cannot run
        on the cluster is refused then, not after the policies ahead of it ran)."""
        self.loop.reset_policy(random.Random(self.cfg.seed))
        self.core.emit(RunStarted())
        self.core.pump()

    def run(self) -> SimResult:
        """Simulate until every step is trained. Ctrl-C stops the run where it is and
        returns what was simulated so far with ``complete=False``.

        The cyclic garbage collector is paused while it runs: a run allocates a few
        short-lived objects per event (all freed by reference counting -- a whole seed-scale
        run leaves a few dozen cyclic objects) and the collector's passes over the run's
        long-lived state cost ~15% of the time. It is re-enabled (if it was) on return.
        """
        core = self.core
        t0 = wallclock.perf_counter()
        complete = True
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            self.start()
            self.faults.arm()
            if not core.done.triggered:
                core.run_until(core.done)
        except RuntimeError as exc:
            if "until" not in str(exc) and "No scheduled events" not in str(exc):
                raise
            raise PolicyError(
                f"policy {self.policy.name} stalled at t={core.env.now:.1f}s: nothing is running "
                f"and only {self.state.version} of {self.state.num_steps} steps are done"
                + below_floor(self.training.trainer.gpus, self.training.layout, self.cfg.gpus)
            ) from None
        except KeyboardInterrupt:
            complete = False
        finally:
            if gc_was_enabled:
                gc.enable()
        now = core.env.now
        core.gpus.close_all(now)
        return SimResult(
            self.state, now, complete, core.events_processed + self.loop.pumped,
            wallclock.perf_counter() - t0, self.trajs, self.loop.trainer.steps,
            dict(core.gpus.busy_seconds), self.faults.close(),
        )
