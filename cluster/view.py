"""The read-only view of the cluster a policy decides from.

A policy sees *what a real scheduler could know*: roles, engines and their load, the
trainer, which trajectories exist for which step and how far they have got -- never the
future (how long a trajectory will run). Everything returned is an immutable snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .ids import EngineId, GpuId, Role, TaskId, TrajectoryId, TrajStatus


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """One rollout engine: ``tp`` GPUs serving one model replica."""

    id: EngineId
    gpus: tuple[GpuId, ...]
    running: int  # admitted trajectories (generating or in tool time), KV held
    queued: int  # dispatched here, waiting for KV capacity
    version: int  # weights version it generates with
    kv_used: int  # KV reserved: admitted contexts plus the turns being generated (may exceed
    # kv_capacity: admission needs room for context and prompt only, a full cache preempts)
    kv_capacity: int  # tokens of KV cache the engine can hold
    draining: bool  # leaving rollout; takes no new work
    syncing: bool  # paused while new weights arrive

    @property
    def load(self) -> int:
        return self.running + self.queued


@dataclass(frozen=True, slots=True)
class TrainerInfo:
    """The training job over the GPUs in role ``TRAIN``."""

    gpus: tuple[GpuId, ...]
    version: int  # version of the weights it holds (optimizer steps taken)
    busy: bool  # a micro-batch or optimizer step is running
    queued_micro_batches: int
    accumulated: int  # trajectories whose gradients await the next optimizer step
    queued_optimizer_steps: int
    # the smallest trainer that can hold the model (its floor) and the unit it grows by (one
    # data-parallel replica); 1 and 1 mean no floor. GPUs beyond whole units idle; a trainer
    # below its floor runs nothing, and a Reassign leaving it with 0 < n < min_gpus is refused.
    min_gpus: int = 1
    grow_unit: int = 1
    floor_reason: str = ""  # what sets the floor (the cost model's memory), for refusals

    def uses(self, gpus: int) -> int:
        """How many of ``gpus`` GPUs this trainer would run on: its floor and whole units above
        it (none below the floor); the rest would idle in the role. (The simulator's
        ``TrainLayout.usable`` is the same rule, the floor being whole units.)"""
        if gpus < self.min_gpus:
            return 0
        return self.min_gpus + (gpus - self.min_gpus) // self.grow_unit * self.grow_unit


@dataclass(frozen=True, slots=True)
class TrajectoryInfo:
    """What is known about one trajectory so far (never its future length)."""

    id: TrajectoryId
    task_id: TaskId
    step: int  # the step whose batch it belongs to
    status: TrajStatus
    engine: EngineId | None
    turns_done: int
    tokens: int  # context tokens so far (prompt + generated)
    min_version: int  # oldest weights version that generated any of its kept tokens (-1: none)
    # pinned to ``engine`` (Dispatch/Move with an engine); False: the cluster places it, and
    # ``engine`` is None while it waits in the cluster queue
    pinned: bool = False


@dataclass(frozen=True, slots=True)
class RolloutTotals:
    """Sums over the active (not draining) rollout engines, without one EngineInfo each."""

    engines: int
    live: int  # trajectories running or queued on them (sum of EngineInfo.load)
    engines_with_queue: int
    kv_used: int
    # trajectories waiting in the cluster-level queue for any engine to admit them (not
    # part of ``live``, which counts what engines hold; see Dispatch)
    unbound: int = 0


@runtime_checkable
class ClusterView(Protocol):
    """Read-only cluster state handed to policies with every event."""

    @property
    def now(self) -> float: ...
    @property
    def num_gpus(self) -> int: ...
    @property
    def tp(self) -> int: ...
    @property
    def num_steps(self) -> int: ...
    @property
    def gpus_per_node(self) -> int: ...  # GPUs per NVLink domain (GPU g is in node g // n); 0: flat

    def role(self, gpu: GpuId) -> Role: ...
    def gpus_in(self, role: Role) -> tuple[GpuId, ...]: ...
    def engine_of(self, gpu: GpuId) -> EngineId: ...
    def engine_gpus(self, engine: EngineId) -> tuple[GpuId, ...]: ...
    def engines(self) -> tuple[EngineId, ...]: ...
    def engine(self, engine: EngineId) -> EngineInfo: ...
    def engine_loads(self) -> tuple[tuple[EngineId, int], ...]: ...
    def trainer(self) -> TrainerInfo: ...
    def batch(self, step: int) -> tuple[TrajectoryId, ...]: ...
    def trajectory(self, trajectory: TrajectoryId) -> TrajectoryInfo: ...
    def status(self, trajectory: TrajectoryId) -> TrajStatus: ...
    def rollout_totals(self) -> RolloutTotals: ...
    def finished(self, step: int | None = None) -> tuple[TrajectoryId, ...]: ...
    def interrupted(self, step: int) -> tuple[TrajectoryId, ...]: ...
    def unfinished(self, step: int) -> int: ...
    def failed_gpus(self) -> tuple[GpuId, ...]: ...
    def leaving_gpus(self) -> tuple[GpuId, ...]: ...
    def cluster_queue(self) -> tuple[TrajectoryId, ...]: ...
    # what the legality check (cluster.legality) reads beyond the above
    @property
    def max_staleness(self) -> int: ...  # the run's staleness bound (the policy's promise)
    def in_micro_batch(self, trajectory: TrajectoryId) -> bool: ...  # in a queued micro-batch
    def min_version(self, trajectory: TrajectoryId) -> int: ...  # trajectory(t).min_version, no record


VIEW_MEMBERS: frozenset[str] = frozenset(n for n in vars(ClusterView) if not n.startswith("_"))


class ReadOnlyView:
    """``view`` behind a guard: exactly the :class:`ClusterView` members, nothing writable.

    Drivers hand policies the store itself (a proxy on every read would cost the inner
    loop); this guard is how a test -- or a policy author -- proves a policy only reads:
    any other attribute, and any assignment, raises ``AttributeError`` naming it. What the
    members return is immutable already (tuples, frozen records, enums)."""

    __slots__ = ("_view",)

    def __init__(self, view: ClusterView) -> None:
        object.__setattr__(self, "_view", view)

    def __getattr__(self, name: str) -> object:
        if name not in VIEW_MEMBERS:
            raise AttributeError(f"{name!r} is not part of the read-only ClusterView a policy is handed")
        return getattr(object.__getattribute__(self, "_view"), name)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a policy set {name!r} on the read-only ClusterView")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"a policy deleted {name!r} from the read-only ClusterView")
