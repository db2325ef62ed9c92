"""Reward by step of live runs, from what they recorded (no re-run): the learning curve.

    python bench/learning_curve.py RUN_DIR [RUN_DIR ...]

Reads each run's ``trace.parquet`` (one row per turn; ``reward``, ``step``,
``trajectory_id``, ``task_id``) and ``meta.json``'s trainer measurements, and prints one
row per step: mean reward, the share of GRPO groups (a task's samples in one step) whose
rewards vary (a group with equal rewards trains nothing), and the trainer's off-policy
figures (stale token share, mean token staleness, truncated-weight and clip fractions,
micro-batch loss). ``--csv FILE`` writes the same table for every run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from rlsched.cluster.record import single_run_dir


def step_rewards(run: Path) -> pd.DataFrame:
    """Per step: trajectories, mean reward, share of groups whose rewards vary."""
    trace = pd.read_parquet(single_run_dir(run) / "trace.parquet")
    per_traj = trace.groupby("trajectory_id").agg(step=("step", "first"), task=("task_id", "first"),
                                                  reward=("reward", "last"), turns=("turn", "size"))
    groups = per_traj.groupby(["step", "task"])["reward"].agg(lambda r: r.nunique() > 1)
    out = per_traj.groupby("step").agg(trajectories=("reward", "size"), reward=("reward", "mean"),
                                       turns=("turns", "mean"))
    out["groups_varying"] = groups.groupby("step").mean()
    return out.reset_index()


def trainer_figures(run: Path) -> pd.DataFrame:
    """Per micro-batch trainer figures, in order (one per step for colocated / async)."""
    meta = json.loads((single_run_dir(run) / "meta.json").read_text())
    rows = meta.get("measurements", {}).get("micro_batches", [])
    keys = ["loss", "stale_tokens", "trained_tokens", "mean_token_staleness", "truncated_fraction",
            "clip_fraction", "stale_log_ratio_mean"]
    return pd.DataFrame([{k: r.get(k) for k in keys} for r in rows])


def curve(run: Path) -> pd.DataFrame:
    df = step_rewards(run)
    tf = trainer_figures(run)
    if len(tf) == len(df):  # one micro-batch per step: align them
        df = pd.concat([df, tf.drop(columns=["trained_tokens"])], axis=1)
    df.insert(0, "run", run.name)
    return df


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--csv", type=Path)
    args = ap.parse_args(argv)
    tables = []
    for given in args.runs:
        run = single_run_dir(given)  # a run record, or the output folder `rlsched run` wrote
        if not (run / "trace.parquet").is_file():
            print(f"{run}: no trace.parquet (not a live run directory)", file=sys.stderr)
            return 2
        t = curve(run)
        tables.append(t)
        with pd.option_context("display.width", 200, "display.max_rows", 500, "display.precision", 3):
            print(t.to_string(index=False))
        meta = json.loads((run / "meta.json").read_text())
        print(f"{run.name}: policy {meta['policy']}, {meta['steps_done']} steps, wall {meta['wall_seconds']:.0f}s, "
              f"first-step reward {t['reward'].iloc[0]:.3f}, last-5-step reward {t['reward'].tail(5).mean():.3f}\n")
    if args.csv:
        pd.concat(tables).to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
