"""The simulator as a backend of the driver loop (:mod:`rlsched.cluster.loop`).

The loop decides what each command means; this adapter maps each backend call onto a
public method of the simulator's collaborators, which charge seconds from the cost model
on the SimPy clock: dispatch, moves, interrupts and timers on the rollout core
(:mod:`.lifecycle`, :mod:`.core`), role changes on :class:`~.roles.Roles`, trainer jobs and
weight sync on :class:`~.training.Training`. Only policy traffic goes through it:
per-turn work stays in the compiled inner loop (:mod:`.turns`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rlsched.cluster.events import TimerFired
from rlsched.cluster.ids import Drain, Role
from rlsched.cluster.loop.trainer_queue import TrainerJob

if TYPE_CHECKING:
    from .lifecycle import Lifecycle
    from .roles import Roles
    from .training import Training


class SimBackend:
    """Implements :class:`rlsched.cluster.loop.backend.Backend` over the simulator's
    rollout core, roles and training (it holds no state of its own)."""

    __slots__ = ("core", "roles", "training")

    def __init__(self, core: Lifecycle, roles: Roles, training: Training) -> None:
        self.core = core
        self.roles = roles
        self.training = training

    def now(self) -> float:
        return self.core.now

    # --------------------------------------------------------------- rollout
    def dispatch(self, trajectories: Sequence[str], engine: int | None) -> None:
        self.core.dispatch(trajectories, engine)

    def reassign(self, gpus: Sequence[int], role: Role, drain: Drain) -> None:
        self.roles.reassign(gpus, role, drain)

    def move(self, trajectories: Sequence[str], engine: int | None) -> None:
        self.core.move(trajectories, engine)

    def interrupt(self, trajectory: str, keep_progress: bool) -> None:
        self.core.interrupt(trajectory, keep_progress)

    def drop(self, trajectories: Sequence[str]) -> None:
        self.core.drop(trajectories)

    def set_timer(self, at: float, tag: str) -> None:
        core = self.core
        core.later(at - core.now, self._timer_fired, tag)

    def _timer_fired(self, tag: str, _unused: None) -> None:
        self.core.emit(TimerFired(tag))

    def sync(self, engines: tuple[int, ...]) -> None:
        self.training.sync(engines)

    # --------------------------------------------------------------- trainer
    def trainer_ready(self) -> bool:
        return self.training.ready()

    def start_job(self, job: TrainerJob) -> None:
        self.training.start_job(job)

    def trained_tokens(self, tids: list[str]) -> int:
        tokens = self.training.trained_tokens
        return int(sum(tokens(t) for t in tids))

    def step_finished(self, trained: list[str]) -> None:
        core = self.core
        st = core.state
        if st.version >= st.num_steps and not core.done.triggered:
            core.done.succeed()

    def job_released(self) -> None:
        self.roles.release_leaving()
