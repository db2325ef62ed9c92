"""The simulator as a backend of the driver loop (:mod:`rlsched.cluster.loop`).

The loop decides what each command means; this adapter maps each backend call onto the
simulator's own machinery, which charges seconds from the cost model on the SimPy clock:
dispatch and moves (:mod:`.lifecycle`), role changes and weight sync (:mod:`.roles`,
:mod:`.training`), timers (:mod:`.core`). Only policy traffic goes through it: per-turn
work stays in the compiled inner loop (:mod:`.turns`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rlsched.cluster.ids import Drain, Role
from rlsched.cluster.loop.trainer_queue import TrainerJob

if TYPE_CHECKING:
    from .driver import SimDriver


class SimBackend:
    """Implements :class:`rlsched.cluster.loop.backend.Backend` for one :class:`SimDriver`."""

    __slots__ = ("d",)

    def __init__(self, driver: SimDriver) -> None:
        self.d = driver

    def now(self) -> float:
        return self.d.now

    # --------------------------------------------------------------- rollout
    def dispatch(self, trajectories: Sequence[str], engine: int | None) -> None:
        self.d._dispatch_all(trajectories, engine)

    def reassign(self, gpus: Sequence[int], role: Role, drain: Drain) -> None:
        self.d._reassign(gpus, role, drain)

    def move(self, trajectories: Sequence[str], engine: int | None) -> None:
        self.d._move_all(trajectories, engine)

    def interrupt(self, trajectory: str, keep_progress: bool) -> None:
        d = self.d
        d._interrupt(d.trajs[trajectory], keep_progress)

    def drop(self, trajectories: Sequence[str]) -> None:
        trajs = self.d.trajs
        for tid in trajectories:
            t = trajs[tid]
            t.wasted += t.output_kept  # its kept tokens will never be trained

    def set_timer(self, at: float, tag: str) -> None:
        d = self.d
        d._later(at - d.now, d._timer_fired, tag)

    def sync(self, engines: tuple[int, ...]) -> None:
        self.d._sync(engines)

    # --------------------------------------------------------------- trainer
    def trainer_ready(self) -> bool:
        d = self.d
        tr = d.trainer
        # no GPUs, restarting after a fault, or below its memory floor: wait
        return bool(tr.gpus) and tr.restart_until <= d.now and len(tr.gpus) >= d.layout.min_gpus

    def start_job(self, job: TrainerJob) -> None:
        self.d._start_job(job)

    def trained_tokens(self, tids: list[str]) -> int:
        tokens = self.d._trained_tokens
        return int(sum(tokens(t) for t in tids))

    def step_finished(self, trained: list[str]) -> None:
        d = self.d
        st = d.state
        if st.version >= st.num_steps and not d._done.triggered:
            d._done.succeed()

    def job_released(self) -> None:
        self.d._release_leaving()
