"""The simulated trainer: a FIFO of micro-batches and optimizer steps over the GPUs in
role TRAIN. Its data-parallel width is read when a job starts and cannot change while it
runs (GPUs asked to leave wait for the job to end)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class MicroBatchJob:
    trajectories: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OptimizerJob:
    pass


@dataclass(slots=True)
class TrainerSim:
    jobs: deque[MicroBatchJob | OptimizerJob] = field(default_factory=deque)
    running: MicroBatchJob | OptimizerJob | None = None
    gpus: list[int] = field(default_factory=list)  # GPUs in TRAIN, ascending
    leaving: dict[int, object] = field(default_factory=dict)  # gpu -> target role
    accumulated: list[str] = field(default_factory=list)
    busy_seconds: float = 0.0
    step_seconds: float = 0.0  # busy time of the current optimizer step
