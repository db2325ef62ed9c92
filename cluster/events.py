"""Events: what a driver tells a policy happened. Frozen, hashable, compared by value.

A driver delivers events one at a time, in simulated (or wall-clock) order, ties broken in
the order the driver observed them; for each event the policy answers with commands
(:mod:`rlsched.cluster.commands`) which the driver applies before the next event.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ids import EngineId, GpuId, Role, TrajectoryId, TrajStatus


@dataclass(frozen=True, slots=True)
class Event:
    """Base class of all events."""


@dataclass(frozen=True, slots=True)
class RunStarted(Event):
    """First event of every run. All GPUs are ``IDLE``; the trainer holds version 0."""


@dataclass(frozen=True, slots=True)
class TrajectoryFinished(Event):
    """A dispatched trajectory stopped generating.

    ``status`` is DONE (its last turn completed), TIMED_OUT (the trace marks it truncated,
    or it outgrew the engine's KV capacity; finished turns are kept), FAILED (its engine
    failed and it could not be retried) or INTERRUPTED (a policy's ``Interrupt`` or a drain
    with ``Drain.INTERRUPT``; finished turns are kept and it may be dispatched again).
    ``engine`` is the engine it was last on.
    """

    trajectory: TrajectoryId
    status: TrajStatus
    engine: EngineId


@dataclass(frozen=True, slots=True)
class MicroBatchFinished(Event):
    """The trainer finished forward+backward for these trajectories; gradients are held
    until ``OptimizerStep``. Version is unchanged."""

    trajectories: tuple[TrajectoryId, ...]


@dataclass(frozen=True, slots=True)
class TrainStepFinished(Event):
    """An optimizer step completed; the trainer now holds ``version`` (old version + 1).
    Engines keep their old weights until a ``SyncWeights``."""

    version: int


@dataclass(frozen=True, slots=True)
class WeightsSynced(Event):
    """These engines now generate with weights ``version``."""

    engines: tuple[EngineId, ...]
    version: int


@dataclass(frozen=True, slots=True)
class RolesChanged(Event):
    """These GPUs finished switching and now have ``role``. For ``ROLLOUT`` the GPUs form
    engines (see ``ClusterView.engine_of``); new engines hold the trainer's version at the
    time their switch *started* (the weights are loaded then: a version published during
    the switch needs a ``SyncWeights``)."""

    gpus: tuple[GpuId, ...]
    role: Role


@dataclass(frozen=True, slots=True)
class EngineIdle(Event):
    """An engine has no admitted and no queued trajectory left."""

    engine: EngineId


@dataclass(frozen=True, slots=True)
class TimerFired(Event):
    """A timer set with ``SetTimer`` reached its time."""

    tag: str


@dataclass(frozen=True, slots=True)
class WorkerFailed(Event):
    """A GPU failed. Its engine (if any) is gone: its in-flight trajectories were put back
    as INTERRUPTED with their finished turns kept (the tokens of the turn in progress are
    wasted) and were reported by TrajectoryFinished events before this one; they are
    listed in ``trajectories`` (empty when the driver cannot tell). The engine's other GPUs
    are ``IDLE``. A trainer GPU's failure loses the current step's gradients: the driver
    re-runs the step's micro-batches itself, from the last completed optimizer step.

    Until ``WorkerRecovered`` the GPU has role ``IDLE`` but is listed by
    ``ClusterView.failed_gpus()`` and no command may use it."""

    gpu: GpuId
    trajectories: tuple[TrajectoryId, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkerRecovered(Event):
    """A failed GPU works again: role ``IDLE``, ready to be reassigned."""

    gpu: GpuId


@dataclass(frozen=True, slots=True)
class TrainerFailed(Event):
    """The training job crashed. The gradients of the step in progress are lost; the
    driver re-runs its micro-batches (already-queued work is kept, in order) from the last
    completed optimizer step ``version`` once the trainer has restarted (``restart_s``).
    Policies need not act: queued commands stay queued."""

    version: int
    restart_s: float


@dataclass(frozen=True, slots=True)
class ToolTimedOut(Event):
    """A tool call of ``trajectory`` hung and was cut at the limit after ``seconds``; the
    trajectory continues with the timeout as the call's result."""

    trajectory: TrajectoryId
    seconds: float


@dataclass(frozen=True, slots=True)
class SyncFailed(Event):
    """A weight sync to ``engines`` failed: they keep their old weights (and go on
    generating). The driver retries it after ``retry_s``; ``WeightsSynced`` follows."""

    engines: tuple[EngineId, ...]
    version: int
    retry_s: float
