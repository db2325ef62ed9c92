"""How a live run learned, per optimizer step: the learning figures its steps table carries.

A live run's trainer writes them as extra columns of ``steps.parquet`` (after the
run-record format's own; ``rlsched.real.train.learning_figures`` makes them): the mean reward of
the trajectories each step trained and its spread within GRPO groups, the loss, the k3 KL
to the starting policy, per-token staleness, the PPO clip and truncation fractions and the
importance-ratio range. Read by column name here, so the analysis never imports ``real/``;
a simulated run (or a live one recorded before these figures existed) has none of them and
gets an empty table, and the report leaves its Learning section out.
"""

from __future__ import annotations

import pandas as pd

from rlsched.cluster.record import RunRecord

# the columns the live trainer writes (rlsched.real.train.learning_figures.LEARNING_COLUMNS)
LEARNING_COLUMNS = (
    "reward_mean", "reward_group_std", "groups_varying", "loss", "kl_to_start",
    "token_staleness_mean", "token_staleness_max", "clip_fraction", "truncated_fraction",
    "ratio_mean", "ratio_min", "ratio_max",
)


def learning_table(rec: RunRecord) -> pd.DataFrame:
    """``step`` (0-based: the version the step trained at) and the learning columns the run
    has, one row per optimizer step; empty when it has none (or only empty values)."""
    steps = rec.steps
    cols = [c for c in LEARNING_COLUMNS if c in steps.columns]
    if not cols or steps.empty or steps[cols].isna().all().all():
        return pd.DataFrame(columns=["step", *LEARNING_COLUMNS])
    out = pd.DataFrame({"step": steps["version"].astype("int64") - 1})
    for c in LEARNING_COLUMNS:
        out[c] = steps[c].astype("float64").to_numpy() if c in steps.columns else float("nan")
    return out.sort_values("step", kind="stable").reset_index(drop=True)
