"""The live driver as a backend of the driver loop (:mod:`rlsched.cluster.loop`).

The loop decides what each command means; this adapter maps each backend call onto the
live driver's parts, which submit the work to real workers on the wall clock: engines and
turns (``loop.rollout``), role changes (``loop.roles``), the trainer lane and weight sync
(``loop.training``), timers and environments (``loop.driver``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rlsched.cluster.ids import Drain, Role
from rlsched.cluster.loop.trainer_queue import TrainerJob

if TYPE_CHECKING:
    from rlsched.real.loop.driver import LiveDriver


class LiveBackend:
    """Implements :class:`rlsched.cluster.loop.backend.Backend` for one :class:`LiveDriver`."""

    def __init__(self, driver: LiveDriver) -> None:
        self.h = driver

    def now(self) -> float:
        return self.h.now()

    # --------------------------------------------------------------- rollout
    def dispatch(self, trajectories: Sequence[str], engine: int | None) -> None:
        h = self.h
        if engine is not None:
            for tid in trajectories:
                h.rollout.dispatch(tid, engine)
            return
        if trajectories and not h.st.engines():
            h.st.least_loaded()  # raises the PolicyError for "no rollout engine"
        h.rollout.dispatch_unbound(tuple(trajectories))

    def reassign(self, gpus: Sequence[int], role: Role, drain: Drain) -> None:
        self.h.roles.reassign(tuple(gpus), role, drain)

    def move(self, trajectories: Sequence[str], engine: int | None) -> None:
        self.h.rollout.move_all(tuple(trajectories), engine)

    def interrupt(self, trajectory: str, keep_progress: bool) -> None:
        self.h.rollout.interrupt(trajectory, keep_progress)

    def drop(self, trajectories: Sequence[str]) -> None:
        for tid in trajectories:
            self.h.close_traj_env(tid)

    def set_timer(self, at: float, tag: str) -> None:
        self.h.set_timer(at, tag)

    def sync(self, engines: tuple[int, ...]) -> None:
        self.h.training.sync(engines)

    # --------------------------------------------------------------- trainer
    def trainer_ready(self) -> bool:
        return self.h.training.ready()

    def start_job(self, job: TrainerJob) -> None:
        self.h.training.start_job(job)

    def trained_tokens(self, tids: list[str]) -> int:
        tokens = self.h.training.trained_tokens
        return int(sum(tokens.get(t, 0) for t in tids))

    def step_finished(self, trained: list[str]) -> None:
        self.h.training.step_finished(trained)

    def job_released(self) -> None:
        self.h.roles.release_leaving()
