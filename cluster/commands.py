"""Commands: what a policy asks a driver to do. Frozen, hashable, compared by value.

Both drivers execute the same commands with the same meaning; only their timing differs
(the simulator's cost model predicts it, calibration measures it). An illegal command (a
GPU in two roles, training an unfinished trajectory, exceeding the policy's staleness
bound) is rejected with :class:`~rlsched.cluster.errors.PolicyError` by
:func:`rlsched.cluster.legality.check` before anything changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ids import Drain, EngineId, GpuId, Role, TrajectoryId


@dataclass(frozen=True, slots=True)
class Command:
    """Base class of all commands."""


@dataclass(frozen=True, slots=True)
class Dispatch(Command):
    """Start (or resume) these trajectories: pinned to ``engine``, or, when ``None``, bound
    late by the cluster.

    Trajectories must be PENDING or INTERRUPTED. A resumed trajectory continues from its
    last finished turn; its context must be prefilled again on the new engine.

    With ``engine=E`` a trajectory is *pinned*: it waits in E's queue for KV room and runs
    every turn on E (prefix cache) until E leaves rollout or a :class:`Move` moves it.

    With ``engine=None`` it is *unpinned*: it waits (status QUEUED, engine None) in one
    cluster-level FIFO queue (``ClusterView.cluster_queue()``) until a rollout engine with
    KV room admits it -- the least-loaded engine (running + queued, lowest id) on which it
    fits, when it is dispatched; any engine that frees room, later. Between turns it
    prefers the engine holding its context; if that engine has no room for its next turn
    it goes back to the head of the cluster queue and any engine may take it (its context
    is then moved or re-prefilled: ``CostModel.migrate_s``). No engine is told about it
    until it is admitted, so an engine never idles while the cluster queue holds work it
    can fit.
    """

    trajectories: tuple[TrajectoryId, ...]
    engine: EngineId | None = None


@dataclass(frozen=True, slots=True)
class Reassign(Command):
    """Move GPUs to ``role``. They pass through ``SWITCHING`` (costed by the driver) and a
    ``RolesChanged`` event reports the end.

    GPUs leaving ``ROLLOUT`` must cover whole engines; their in-flight trajectories are
    drained per ``drain`` (see :class:`~rlsched.cluster.ids.Drain`) -- never lost, never
    restarted from zero. GPUs going to ``ROLLOUT`` must form whole engines (``tp`` GPUs,
    aligned). GPUs leaving ``TRAIN`` while a micro-batch runs leave after it completes: the
    trainer's data-parallel width only changes between micro-batches.
    """

    gpus: tuple[GpuId, ...]
    role: Role
    drain: Drain = Drain.MIGRATE


@dataclass(frozen=True, slots=True)
class TrainMicroBatch(Command):
    """Forward+backward over these finished trajectories on the GPUs in ``TRAIN``; the
    gradients accumulate until ``OptimizerStep``. Queued behind a running micro-batch."""

    trajectories: tuple[TrajectoryId, ...]


@dataclass(frozen=True, slots=True)
class OptimizerStep(Command):
    """Apply the accumulated gradients: version += 1, then ``TrainStepFinished``.
    Queued behind pending micro-batches."""


@dataclass(frozen=True, slots=True)
class Train(Command):
    """Shorthand for ``TrainMicroBatch(trajectories)`` followed by ``OptimizerStep()``."""

    trajectories: tuple[TrajectoryId, ...]


@dataclass(frozen=True, slots=True)
class SyncWeights(Command):
    """Send the trainer's current weights to ``engines`` (all rollout engines when
    ``None``). Each engine pauses generation while its weights arrive (in-flight
    trajectories keep their KV and continue afterwards with the new version), then a
    ``WeightsSynced`` event reports it."""

    engines: tuple[EngineId, ...] | None = None


@dataclass(frozen=True, slots=True)
class Interrupt(Command):
    """Stop these running or queued trajectories now. With ``keep_progress`` their finished
    turns are kept (status INTERRUPTED, resumable); otherwise they restart from turn 0 when
    dispatched again and the discarded tokens are counted as wasted."""

    trajectories: tuple[TrajectoryId, ...]
    keep_progress: bool = True


@dataclass(frozen=True, slots=True)
class Move(Command):
    """Move these queued or running trajectories to rollout engine ``engine`` (pinning them
    there), or, when ``None``, to the head of the cluster queue (unpinned: the cluster
    places them where KV is free, see :class:`Dispatch`).

    Legal for trajectories that are QUEUED or RUNNING, each at most once, none already
    where it is sent (on ``engine``; or unpinned in the cluster queue for ``None``), to an
    active (not draining) rollout engine. Nothing is lost: finished turns and the tokens of
    the turn in progress are kept (``TrajectoryInfo.turns_done``/``tokens`` unchanged);
    a trajectory in a tool call keeps running it and joins its destination when it returns.

    Cost (the simulator charges it from ``CostModel.migrate_s``; the live driver aborts
    the request and resumes it with its prefix): a trajectory whose context was resident on
    its engine leaves it at once, freeing that KV; on the destination its context is
    re-prefilled, or transferred, whichever the cost model finds cheaper (a transfer is
    counted from the moment it left, so time spent waiting in a queue overlaps it). A
    trajectory that held no KV (waiting in a queue) moves for free. Each move of a context
    counts in ``migrations`` of the run record; a ``Migrate`` event names it.
    """

    trajectories: tuple[TrajectoryId, ...]
    engine: EngineId | None = None


@dataclass(frozen=True, slots=True)
class Drop(Command):
    """Give up on these finished (or interrupted) trajectories: they are not trained.
    Counted as dropped in the run record -- never silently lost."""

    trajectories: tuple[TrajectoryId, ...]


@dataclass(frozen=True, slots=True)
class SetTimer(Command):
    """Deliver ``TimerFired(tag)`` at absolute time ``at`` (seconds since run start)."""

    at: float
    tag: str
