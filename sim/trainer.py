"""The simulated trainer: the GPUs in role TRAIN that run the driver loop's jobs (the
FIFO of micro-batches and optimizer steps is :mod:`rlsched.cluster.loop.trainer_queue`).
Its data-parallel width is read when a job starts and cannot change while it runs (GPUs
asked to leave wait for the job to end)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlsched.cluster.loop.trainer_queue import MicroBatchJob


@dataclass(slots=True)
class TrainerSim:
    gpus: list[int] = field(default_factory=list)  # GPUs in TRAIN, ascending (see add/remove)
    busy_seconds: float = 0.0
    # the running job (a fault can abort it: see rlsched.sim.faults)
    run_token: int = 0  # bumped per start and per abort; a stale completion is ignored
    run_started: float = 0.0
    run_gpus: tuple[int, ...] = ()
    run_seconds: float = 0.0  # charged when it started (an aborted job's still count)
    # micro-batches finished since the last optimizer step: (job, seconds, GPUs); a
    # fault re-runs them
    done_jobs: list[tuple[MicroBatchJob, float, int]] = field(default_factory=list)
    restart_until: float = 0.0  # no job starts before this (trainer restarting)
    _gpus: tuple[int, ...] | None = ()  # tuple(gpus), None once they change
    _runs_of: tuple[int, ...] = ()
    _runs: tuple[tuple[int, int], ...] = ()

    def add(self, gpus: tuple[int, ...]) -> None:
        self.gpus.extend(gpus)
        self.gpus.sort()
        self._gpus = None

    def remove(self, gpu: int) -> None:
        self.gpus.remove(gpu)
        self._gpus = None

    def remove_all(self, gpus: list[int]) -> None:
        """:meth:`remove` for several GPUs (one pass: a whole trainer can leave at once)."""
        out = set(gpus)
        missing = out.difference(self.gpus)
        if missing:
            raise ValueError(f"GPUs {sorted(missing)} are not the trainer's")
        self.gpus = [g for g in self.gpus if g not in out]
        self._gpus = None

    def current(self) -> tuple[int, ...]:
        """The GPUs as a tuple: the same object until they change (so :meth:`runs` and
        ``GpuStates.set_runs`` recognise the set without comparing it)."""
        if self._gpus is None:
            self._gpus = tuple(self.gpus)
        return self._gpus

    def runs(self, gpus: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
        """``gpus`` (ascending) as (first, count) runs of consecutive ids. Jobs run on the
        same GPUs until the trainer's set changes, so the last answer is kept."""
        if gpus is not self._runs_of and gpus != self._runs_of:
            self._runs_of, self._runs = gpus, runs_of(gpus)
        return self._runs


def runs_of(gpus: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """Ascending ids as (first, count) runs of consecutive ids. Elastic's trainer holds
    hundreds of GPUs and its set changes an engine at a time: one pass that keeps only the
    current run's ends (a tuple per GPU, an earlier version, was slow; NumPy's fixed cost
    per call made it 1.4-17x slower than this pass from 16 to 900 GPUs)."""
    if not gpus:
        return ()
    out = []
    first = prev = gpus[0]
    for g in gpus[1:]:
        if g != prev + 1:
            out.append((first, prev - first + 1))
            first = g
        prev = g
    out.append((first, prev - first + 1))
    return tuple(out)
