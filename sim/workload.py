"""A trace as compact per-turn arrays, plus the run's batches.

The simulator never holds one Python object per turn: per-turn values live in NumPy
arrays and are turned into short Python lists only for trajectories in flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Workload:
    """Per-turn arrays of a trace, indexed by trajectory."""

    trajectory_ids: tuple[str, ...]
    task_ids: tuple[str, ...]
    start: np.ndarray  # first row of each trajectory
    turns: np.ndarray  # number of turns
    truncated: np.ndarray  # bool per trajectory
    prompt: np.ndarray  # per turn
    output: np.ndarray
    env: np.ndarray
    parent: tuple[str | None, ...]
    branch_turn: np.ndarray  # -1 when not branched
    index: dict[str, int]

    @classmethod
    def from_frame(cls, df: pd.DataFrame) -> Workload:
        """``df`` is a validated trace (rows grouped by trajectory, turns ascending)."""
        tid = df["trajectory_id"].to_numpy()
        n = len(tid)
        if n == 0:
            raise ValueError("empty trace")
        change = np.empty(n, dtype=bool)
        change[0] = True
        change[1:] = tid[1:] != tid[:-1]
        start = np.flatnonzero(change)
        turns = np.diff(np.append(start, n))
        ids = tuple(str(x) for x in tid[start])
        tasks = tuple(str(x) for x in df["task_id"].to_numpy()[start])
        if "truncated" in df.columns:
            tr = df["truncated"].fillna(False).to_numpy(dtype=bool)
            truncated = np.logical_or.reduceat(tr, start)
        else:
            truncated = np.zeros(len(start), dtype=bool)
        if "parent_trajectory_id" in df.columns:
            par = df["parent_trajectory_id"].to_numpy()[start]
            parent = tuple(None if (p is None or p != p or p == "") else str(p) for p in par)
            bt = df["branch_turn"].to_numpy(dtype="float64", na_value=np.nan)[start]
            branch = np.where(np.isnan(bt), -1, bt).astype(np.int64)
        else:
            parent = (None,) * len(start)
            branch = np.full(len(start), -1, dtype=np.int64)
        return cls(
            ids, tasks, start.astype(np.int64), turns.astype(np.int64), truncated,
            df["prompt_tokens"].to_numpy(dtype=np.int64),
            df["output_tokens"].to_numpy(dtype=np.int64),
            df["env_seconds"].to_numpy(dtype=np.float64),
            parent, branch, {t: i for i, t in enumerate(ids)},
        )

    def turn_lists(self, i: int) -> tuple[list[int], list[int], list[float]]:
        s, e = int(self.start[i]), int(self.start[i] + self.turns[i])
        return self.prompt[s:e].tolist(), self.output[s:e].tolist(), self.env[s:e].tolist()


Batches = Sequence[Sequence[tuple[str, str]]]  # per step: (run trajectory id, trace trajectory id)


def simple_batches(workload: Workload, steps: int, per_step: int) -> list[list[tuple[str, str]]]:
    """Consecutive trajectories of the trace, ``per_step`` per step (tests and benches)."""
    out = []
    n = len(workload.trajectory_ids)
    for s in range(steps):
        rows = []
        for k in range(per_step):
            i = (s * per_step + k) % n
            rid = workload.trajectory_ids[i]
            lap = (s * per_step + k) // n
            rows.append((rid if lap == 0 else f"{rid}#{lap + 1}", rid))
        out.append(rows)
    return out
