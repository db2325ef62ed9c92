"""Summary statistics of a trace: the numbers ``rlsched trace inspect`` prints.

Percentiles describe the long tail that scheduling policies fight (p99 and max matter more
than the mean). Computed with bincount over factorised ids, so it stays fast at tens of
millions of rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

PERCENTILES = (50, 90, 99)
STAT_COLUMNS = ("count", "p50", "p90", "p99", "max", "mean")


def _row(values: np.ndarray) -> list[float]:
    if values.size == 0:
        return [0.0] + [float("nan")] * (len(STAT_COLUMNS) - 1)
    pct = np.percentile(values, PERCENTILES)
    return [float(values.size), *map(float, pct), float(values.max()), float(values.mean())]


def trace_stats(df: pd.DataFrame) -> pd.DataFrame:
    """Distribution and count summary of a canonical trace.

    Returns a frame indexed by metric with columns ``count, p50, p90, p99, max, mean``.
    Distribution rows: ``turns_per_trajectory``, ``output_tokens_per_turn``,
    ``prompt_tokens_per_turn``, ``context_tokens_per_trajectory`` (prompt + output tokens of
    all its turns: the longest context it reaches), ``env_seconds_per_turn``,
    ``env_seconds_per_trajectory``, ``trajectories_per_task``; ``count`` is how many values
    each summarises. Count rows (only ``count`` filled): ``tasks``, ``trajectories``,
    ``rows``, ``branched`` (trajectories with a parent), ``truncated`` (trajectories marked
    truncated on any row).
    """
    traj, _ = pd.factorize(df["trajectory_id"])
    task, _ = pd.factorize(df["task_id"])
    n_traj = int(traj.max()) + 1 if len(traj) else 0
    prompt = df["prompt_tokens"].to_numpy(dtype=np.float64)
    output = df["output_tokens"].to_numpy(dtype=np.float64)
    env = df["env_seconds"].to_numpy(dtype=np.float64)
    turns = np.bincount(traj, minlength=n_traj).astype(np.float64)
    context = np.bincount(traj, weights=prompt + output, minlength=n_traj)
    env_traj = np.bincount(traj, weights=env, minlength=n_traj)
    first = np.unique(traj, return_index=True)[1] if n_traj else np.array([], dtype=np.int64)
    per_task = np.bincount(task[first]).astype(np.float64) if n_traj else np.array([])

    rows = {
        "turns_per_trajectory": _row(turns),
        "output_tokens_per_turn": _row(output),
        "prompt_tokens_per_turn": _row(prompt),
        "context_tokens_per_trajectory": _row(context),
        "env_seconds_per_turn": _row(env),
        "env_seconds_per_trajectory": _row(env_traj),
        "trajectories_per_task": _row(per_task),
    }
    branched = 0
    if "parent_trajectory_id" in df.columns and n_traj:
        parents = df["parent_trajectory_id"].to_numpy(dtype=object)[first]
        branched = int(pd.notna(parents).sum())
    truncated = 0
    if "truncated" in df.columns and n_traj:
        flags = df["truncated"].to_numpy(dtype=bool)
        truncated = int((np.bincount(traj, weights=flags, minlength=n_traj) > 0).sum())
    counts = {
        "tasks": len(np.unique(task)),
        "trajectories": n_traj,
        "rows": len(df),
        "branched": branched,
        "truncated": truncated,
    }
    nan = [float("nan")] * (len(STAT_COLUMNS) - 1)
    for name, value in counts.items():
        rows[name] = [float(value), *nan]
    out = pd.DataFrame.from_dict(rows, orient="index", columns=list(STAT_COLUMNS))
    out.index.name = "metric"
    return out
