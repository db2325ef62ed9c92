"""Identifiers and small enums shared by policies and both drivers."""

from __future__ import annotations

from enum import StrEnum

GpuId = int
EngineId = int
TrajectoryId = str
TaskId = str


class Role(StrEnum):
    """What a GPU is doing. A GPU has exactly one role at any time."""

    ROLLOUT = "rollout"
    TRAIN = "train"
    SWITCHING = "switching"
    IDLE = "idle"


class Drain(StrEnum):
    """What happens to in-flight trajectories on GPUs that leave ``ROLLOUT``.

    MIGRATE:     their context moves to another rollout engine (KV transfer or re-prefill,
                 whichever the driver's cost model says is cheaper) and they keep going.
    FINISH_TURN: the engine stops admitting work, lets each trajectory finish its current
                 generation, then migrates it between turns (no KV in flight).
    INTERRUPT:   they stop at once, keeping every finished turn; status ``INTERRUPTED``;
                 the policy may dispatch them again later and they resume where they were.
    """

    MIGRATE = "migrate"
    FINISH_TURN = "finish_turn"
    INTERRUPT = "interrupt"


class TrajStatus(StrEnum):
    """Lifecycle of one trajectory in a run.

    PENDING -> QUEUED -> RUNNING -> (DONE | TIMED_OUT | FAILED | INTERRUPTED)
    then TRAINED or DROPPED. INTERRUPTED trajectories may be dispatched again (they resume
    from their last finished turn). Nothing leaves the run without one of the terminal
    statuses, which is how ``lost_trajectories`` is counted.
    """

    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    TIMED_OUT = "timed_out"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    TRAINED = "trained"
    DROPPED = "dropped"

    @property
    def finished(self) -> bool:
        """Generation has stopped and the trajectory can be trained, dropped or resumed."""
        return self in _FINISHED


_FINISHED = frozenset(
    {TrajStatus.DONE, TrajStatus.TIMED_OUT, TrajStatus.FAILED, TrajStatus.INTERRUPTED}
)


class GpuState(StrEnum):
    """Per-GPU state recorded in run records; finer than :class:`Role`, for analysis.

    The analysis attributes idleness to a cause from these (DESIGN.md, report).
    """

    GENERATE = "generate"  # engine is prefilling or decoding at least one sequence
    TOOL_WAIT = "tool_wait"  # engine holds trajectories, all of them in environment/tool time
    ROLLOUT_IDLE = "rollout_idle"  # engine holds no trajectory (tail elsewhere, or no work)
    SYNC = "sync"  # engine paused while new weights arrive
    SWITCH = "switch"  # GPU changing role
    TRAIN = "train"  # GPU computing a training micro-batch or optimizer step
    TRAIN_IDLE = "train_idle"  # GPU holds the trainer but has no data to train
    IDLE = "idle"  # role IDLE
    FAILED = "failed"  # failed (fault injection; role IDLE, unusable) until it recovers
