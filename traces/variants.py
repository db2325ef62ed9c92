"""Trace variants the planner evaluates on: bootstrap resamples and tail edits.

The planner asks two "what if" questions of its best configurations: would the choice
survive a different draw of tasks (bootstrap resamples), and does it depend on the few
longest trajectories (the tail removed, or made twice as long)? Each variant is built here
as an ordinary canonical trace and passed back through :func:`validate_trace`, so the batch
drawer and the simulator treat it exactly like a trace read from a file.

Inputs are canonical traces (``load_trace``/``validate_trace`` output): rows grouped by
trajectory in first-appearance order, turns ascending.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from rlsched.traces import validate_trace

# Columns that tie rows to a recorded schedule; a resample is a new pool of tasks, so they go.
_SCHEDULE_COLUMNS = ("step", "policy_version")


def _trajectory_spans(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """First row and row count of each trajectory (rows are grouped by trajectory)."""
    tid = df["trajectory_id"].to_numpy()
    change = np.empty(len(tid), dtype=bool)
    change[0] = True
    change[1:] = tid[1:] != tid[:-1]
    start = np.flatnonzero(change)
    return start, np.diff(np.append(start, len(tid)))


def _suffixed(col: pd.Series, suffix: np.ndarray) -> pd.Series:
    """``col + suffix`` element-wise, keeping missing values missing."""
    values = col.to_numpy(dtype=object)
    out = np.empty(len(values), dtype=object)
    for i, (v, s) in enumerate(zip(values, suffix, strict=True)):
        out[i] = None if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v}{s}"
    return pd.Series(out, index=col.index, dtype=object)


def bootstrap_tasks(df: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Draw as many tasks as the trace has, with replacement, keeping whole groups.

    The ``j``-th drawn task gets the suffix ``~b<j>`` on its task, trajectory and parent
    ids, so a task drawn twice becomes two distinct tasks with unique trajectory ids. Any
    ``step``/``policy_version`` columns are dropped: the resample is a pool of tasks in draw
    order, which is how ``draw_batches`` then splits it into steps.
    """
    tasks, first = np.unique(df["task_id"].to_numpy(dtype=object), return_index=True)
    tasks = tasks[np.argsort(first)]  # file order
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(tasks), size=len(tasks))
    rows_of = df.groupby("task_id", sort=False).indices
    take = [rows_of[tasks[k]] for k in pick]
    index = np.concatenate(take)
    suffix = np.repeat(np.array([f"~b{j}" for j in range(len(take))], dtype=object),
                       [len(t) for t in take])
    out = df.iloc[index].reset_index(drop=True)
    out = out.drop(columns=[c for c in _SCHEDULE_COLUMNS if c in out.columns])
    for col in ("task_id", "trajectory_id", "parent_trajectory_id"):
        if col in out.columns:
            out[col] = _suffixed(out[col], suffix)
    return validate_trace(out, f"bootstrap resample (seed {seed})")


def longest_trajectories(df: pd.DataFrame, fraction: float) -> set[str]:
    """Ids of the ``fraction`` longest trajectories (at least one): most turns first, then
    most generated tokens, then file order -- a deterministic cut."""
    start, turns = _trajectory_spans(df)
    out_tokens = np.add.reduceat(df["output_tokens"].to_numpy(dtype=np.int64), start)
    n = max(1, math.ceil(fraction * len(start)))
    order = np.lexsort((np.arange(len(start)), -out_tokens, -turns))[:n]
    ids = df["trajectory_id"].to_numpy(dtype=object)[start]
    return {str(ids[i]) for i in order}


def drop_tail(df: pd.DataFrame, fraction: float = 0.05) -> pd.DataFrame:
    """The trace without its ``fraction`` longest trajectories.

    A fork whose parent is removed keeps its rows (they already hold the shared prefix) and
    becomes a plain trajectory, so no group loses more than the removed trajectories.
    """
    gone = longest_trajectories(df, fraction)
    out = df[~df["trajectory_id"].isin(gone)].reset_index(drop=True)
    if "parent_trajectory_id" in out.columns:
        orphan = out["parent_trajectory_id"].isin(gone)
        if orphan.any():
            out["parent_trajectory_id"] = out["parent_trajectory_id"].where(~orphan, None)
            out["branch_turn"] = out["branch_turn"].astype("Int64").mask(orphan)
    return validate_trace(out, f"trace without its {fraction:.0%} longest trajectories")


def double_tail(df: pd.DataFrame, fraction: float = 0.05) -> pd.DataFrame:
    """The trace with each of its ``fraction`` longest trajectories played twice over:
    its turns are repeated once more after its last turn (turn numbers continue), so the
    tail is twice as long while every shared fork prefix stays intact."""
    longest = longest_trajectories(df, fraction)
    start, turns = _trajectory_spans(df)
    ids = df["trajectory_id"].to_numpy(dtype=object)[start]
    factor = np.array([2 if str(t) in longest else 1 for t in ids], dtype=np.int64)
    new_len = turns * factor
    new_start = np.concatenate(([0], np.cumsum(new_len)[:-1]))
    traj_of_row = np.repeat(np.arange(len(start)), new_len)
    offset = np.arange(int(new_len.sum()), dtype=np.int64) - new_start[traj_of_row]
    src = start[traj_of_row] + offset % turns[traj_of_row]
    out = df.iloc[src].reset_index(drop=True)
    out["turn"] = offset
    return validate_trace(out, f"trace with its {fraction:.0%} longest trajectories doubled")
