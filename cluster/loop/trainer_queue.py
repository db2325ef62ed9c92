"""The trainer queue, once for both drivers: what ``TrainMicroBatch``, ``Train`` and
``OptimizerStep`` mean.

Jobs run one at a time, in the order the policy issued them. A finished micro-batch adds
its trajectories to the step's accumulation (``MicroBatchFinished``); a finished optimizer
step marks the accumulation trained at the current version, appends the step's row, bumps
the version and reports ``TrainStepFinished``. The queue keeps the trainer fields of
:class:`~rlsched.cluster.state.ClusterState` the policy reads (``queued_micro_batches``,
``queued_optimizer_steps``, ``trainer_busy``, ``accumulated``, ``version``) -- nothing else
writes them, except a driver's fault path re-queuing an aborted step (:meth:`requeue`).

*How* a job runs is the backend's (:class:`TrainerBackend`): the simulator charges it
seconds from its cost model, the live driver submits it to the trainer lane. Either way
the backend calls :meth:`TrainerQueue.job_finished` when it ends, with its seconds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from rlsched.cluster.events import Event, MicroBatchFinished, TrainStepFinished
from rlsched.cluster.state import ClusterState


@dataclass(frozen=True, slots=True)
class MicroBatchJob:
    """Forward and backward over these trajectories; gradients accumulate."""

    trajectories: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OptimizerJob:
    """Apply the accumulated gradients: the version moves on."""


TrainerJob = MicroBatchJob | OptimizerJob

# the columns of a step row (the run record's steps table)
STEP_COLUMNS = ("version", "time", "trajectories", "trained_tokens", "train_seconds", "max_staleness")


class TrainerBackend(Protocol):
    """What the trainer queue asks of a driver (see :mod:`.backend` for the whole protocol)."""

    def now(self) -> float:
        """The driver's clock (simulated or wall seconds since the run started)."""

    def trainer_ready(self) -> bool:
        """Whether a job may start now (the trainer has GPUs, above its memory floor, no
        membership change or restart in flight)."""

    def start_job(self, job: TrainerJob) -> None:
        """Run ``job`` on the trainer; call :meth:`TrainerQueue.job_finished` when it ends."""

    def trained_tokens(self, tids: list[str]) -> int:
        """Tokens the step trains for these trajectories (the step row's ``trained_tokens``)."""

    def step_finished(self, trained: list[str]) -> None:
        """After an optimizer step was counted (version bumped, event emitted): the
        driver's own follow-up (the simulator ends the run after the last step; the live
        driver closes the trained trajectories' environments and records the publish)."""

    def job_released(self) -> None:
        """The trainer is between jobs: GPUs that waited to leave it may leave now."""


class TrainerQueue:
    """The FIFO of trainer jobs of one run and the step rows it produced."""

    def __init__(self, state: ClusterState, backend: TrainerBackend, emit: Callable[[Event], None], *,
                 version_base: int = 0, progress: Callable[[int, int, float], None] | None = None) -> None:
        """``version_base`` is added to versions on the way out (the step rows and the
        progress callback): a resumed live run counts its own versions from 0."""
        self.state = state
        self.backend = backend
        self.emit = emit
        self.base = version_base
        self.progress = progress
        self.jobs: deque[TrainerJob] = deque()
        self.running: TrainerJob | None = None
        self.accumulated: list[str] = []  # trajectories of the step's finished micro-batches
        self.step_seconds = 0.0  # trainer seconds of the current step
        self.steps: list[dict] = []  # one row per optimizer step (STEP_COLUMNS)

    # ------------------------------------------------------------ commands
    def micro_batch(self, tids: Iterable[str]) -> None:
        """``TrainMicroBatch``: queue one micro-batch job."""
        tids = tuple(tids)
        self.state.mark_in_micro_batch(tids)
        self.jobs.append(MicroBatchJob(tids))
        self.state.queued_micro_batches += 1

    def optimizer_step(self) -> None:
        """``OptimizerStep``: queue the step that closes the accumulation."""
        self.jobs.append(OptimizerJob())
        self.state.queued_optimizer_steps += 1

    # ------------------------------------------------------------------ run
    def next(self) -> None:
        """Start the next job if the trainer is free and the backend can run one."""
        if self.running is not None or not self.jobs or not self.backend.trainer_ready():
            return
        job = self.jobs.popleft()
        self.running = job
        st = self.state
        st.trainer_busy = True
        if isinstance(job, MicroBatchJob):
            st.queued_micro_batches -= 1
        self.backend.start_job(job)

    def job_finished(self, job: TrainerJob, seconds: float) -> None:
        """The backend's report that ``job`` ran for ``seconds`` of trainer time."""
        st = self.state
        self.running = None
        st.trainer_busy = False
        self.step_seconds += seconds
        if isinstance(job, MicroBatchJob):
            self.accumulated.extend(job.trajectories)
            st.accumulated = self.accumulated
            self.emit(MicroBatchFinished(job.trajectories))
        else:
            self._step_finished()
        self.backend.job_released()
        self.next()

    def _step_finished(self) -> None:
        st = self.state
        backend = self.backend
        now = backend.now()
        trained = self.accumulated
        st.queued_optimizer_steps -= 1
        st.mark_trained(trained, st.version)
        # (a trajectory cut before its first turn finished has no token of any version:
        # min_version -1 is not a staleness; as analysis counts it)
        trajs = st.trajs
        stale = max((st.version - trajs[t].min_version for t in trained if trajs[t].min_version >= 0),
                    default=0)
        self.steps.append({
            "version": self.base + st.version + 1, "time": now, "trajectories": len(trained),
            "trained_tokens": int(backend.trained_tokens(trained)),
            "train_seconds": self.step_seconds, "max_staleness": int(stale),
        })
        self.step_seconds = 0.0
        self.accumulated = []
        st.accumulated = self.accumulated
        st.version += 1
        self.emit(TrainStepFinished(st.version))
        if self.progress is not None:
            self.progress(self.base + st.version, self.base + st.num_steps, now)
        backend.step_finished(trained)

    # --------------------------------------------------------------- faults
    def requeue(self, lost_running_seconds: float | None, done: Iterable[MicroBatchJob]) -> None:
        """The step's gradients are lost (a trainer fault): put the step's finished
        micro-batches ``done`` and the running job back at the head of the queue, in
        order, and empty the accumulation. ``lost_running_seconds`` is the trainer time
        the aborted running job is charged (None: no job was running)."""
        st = self.state
        done = list(done)
        requeue: list[TrainerJob] = list(done)
        if self.running is not None:
            job = self.running
            self.running = None
            st.trainer_busy = False
            self.step_seconds += lost_running_seconds or 0.0
            requeue.append(job)
            if isinstance(job, MicroBatchJob):
                st.queued_micro_batches += 1
        st.queued_micro_batches += len(done)
        self.jobs.extendleft(reversed(requeue))
        self.accumulated = []
        st.accumulated = self.accumulated
