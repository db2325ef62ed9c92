"""What a live run writes: per-GPU state intervals, the trajectory and step tables, and the
trace it recorded -- in exactly the formats the simulator writes, so the analysis and the
replay path cannot tell a live run from a simulated one (``meta.driver`` says which).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from rlsched.cluster.ids import GpuState, TrajStatus
from rlsched.cluster.record import RunRecorder
from rlsched.cluster.state import ClusterState
from rlsched.real.record.recorder import MemoryRecorder, replace_durably
from rlsched.real.rollout.agent_loop import AgentTrajectory
from rlsched.real.train.learning_figures import LEARNING_COLUMNS

RecorderLike = RunRecorder | MemoryRecorder

STEP_COLUMNS = ["version", "time", "trajectories", "trained_tokens", "train_seconds", "max_staleness"]
TRAJECTORY_COLUMNS = [
    "trajectory", "task_id", "step", "status", "finish_status", "dispatch_time", "finish_time",
    "trained_version", "min_version", "max_version", "turns_total", "turns_done",
    "prompt_tokens", "output_tokens", "trained_tokens", "wasted_tokens", "dispatches", "migrations",
]


class GpuTimeline:
    """Per-GPU state with wall-clock start times; every change closes an interval."""

    def __init__(self, num_gpus: int, recorder: RecorderLike, start: float = 0.0) -> None:
        self.state = [GpuState.IDLE] * num_gpus
        self.since = [start] * num_gpus
        self.step = [-1] * num_gpus
        self.rec = recorder
        self.seconds: dict[str, float] = {}

    def set(self, gpus: Iterable[int], state: GpuState, now: float, step: int = -1) -> None:
        for g in gpus:
            if self.state[g] is state and self.step[g] == step:
                continue
            self._close(g, now)
            self.state[g], self.since[g], self.step[g] = state, now, step

    def _close(self, g: int, now: float) -> None:
        if now > self.since[g]:
            st = self.state[g].value
            self.seconds[st] = self.seconds.get(st, 0.0) + now - self.since[g]
            self.rec.interval(g, 1, self.since[g], now, st, self.step[g])

    def close_all(self, now: float) -> None:
        for g in range(len(self.state)):
            self._close(g, now)
            self.since[g] = now


def trajectory_table(st: ClusterState, trajs: dict[str, AgentTrajectory], trained: dict[str, int],
                     base: int = 0) -> pd.DataFrame:
    """One row per trajectory; ``base`` (a resumed run's first version) is added to its
    step and versions, which the driver counts from 0."""

    def b(x: int) -> int:
        return x + base if x >= 0 else x

    rows = []
    for tid, ts in st.trajs.items():
        t = trajs[tid]
        rows.append((
            tid, ts.task_id, b(ts.step), ts.status.value,
            ts.finish_status.value if ts.finish_status else "",
            ts.dispatch_time, ts.finish_time, b(ts.trained_version), b(ts.min_version), b(ts.max_version),
            t.turns_done, ts.turns_done, t.prompt_tokens, t.output_tokens,
            trained.get(tid, 0) if ts.status is TrajStatus.TRAINED else 0,
            t.wasted + (t.output_tokens if ts.status is TrajStatus.DROPPED else 0),
            ts.dispatches, ts.migrations,
        ))
    df = pd.DataFrame(rows, columns=TRAJECTORY_COLUMNS)
    for c in ("dispatch_time", "finish_time"):
        df[c] = df[c].astype(np.float64)
    return df


def steps_table(steps: list[dict]) -> pd.DataFrame:
    """The steps table: :data:`STEP_COLUMNS`, then the learning figures
    (``learning_figures.LEARNING_COLUMNS``, float, NaN where a step has none) when the rows
    carry them -- extra columns a reader of the run-record format may ignore."""
    extra = [c for c in LEARNING_COLUMNS if any(c in row for row in steps)]
    df = pd.DataFrame(steps, columns=STEP_COLUMNS + extra)
    for c in extra:
        df[c] = df[c].astype(np.float64)
    return df


def trace_frame(trajs: Iterable[AgentTrajectory], base: int = 0) -> pd.DataFrame:
    """The turns of ``trajs`` in the replay schema; ``base`` is added to the versions (a
    trajectory's ``step`` is already the run's)."""
    rows = [r for t in trajs for r in t.trace_rows()]
    df = pd.DataFrame(rows)
    if base and len(df):
        df["policy_version"] = df["policy_version"] + base
    return df


def write_trace(trace: pd.DataFrame, path: Path) -> Path | None:
    """The turns the run produced, in the replay schema (DESIGN.md, Traces); trajectories
    that never finished a turn have no rows. Returns None when there is nothing to write."""
    from rlsched.traces.load import write_trace as write

    if trace.empty:
        return None
    df = trace.reset_index(drop=True)
    df["turn"] = df["turn"].astype(np.int64)
    for c in ("prompt_tokens", "output_tokens", "step", "policy_version"):
        df[c] = df[c].astype(np.int64)
    df["env_seconds"] = df["env_seconds"].astype(np.float64)
    df["reward"] = df["reward"].astype(np.float64)
    df["truncated"] = df["truncated"].astype(bool)
    tmp = write(df, path.parent / f".{path.stem}.tmp{path.suffix}")
    replace_durably(tmp, path)  # a reader sees the previous trace or this one, whole
    return path
