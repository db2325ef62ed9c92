"""Simulator fidelity against live runs (issue #11): per-step error, live spread, ranking.

Usage::

    python bench/bench_fidelity.py --cost cost.toml RUN_DIR [RUN_DIR ...] [--out DIR]

Each RUN_DIR is a live run (``rlsched run --live --out RUN_DIR``). Every run is replayed
in the simulator under ``--cost`` (``rlsched fidelity``'s code). Printed:

* the per-step error distribution over all runs' steps (median, p90, max of
  ``|sim - live| / live``);
* the live spread: for each policy run more than once with the same config, the per-step
  ``|a - b| / mean`` between its first two runs (the live backend's own noise);
* the ranking check: steps/hour per policy, live (mean over its runs) and simulated
  (mean over the replays), and whether both rank the policies in the same order (policies
  within ``--tie-pct`` percent of each other tie; a tie matches only a tie).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

from rlsched.analysis.fidelity import step_table
from rlsched.analysis.fidelity_report import write_fidelity_report
from rlsched.cluster.record import RunRecord
from rlsched.fidelity import fidelity
from rlsched.sim.cost import CostModel


def steps_per_hour(rec: RunRecord) -> float:
    end = float(rec.steps["time"].max())
    return 3600.0 * len(rec.steps) / end if end > 0 else float("nan")


def ordered(rank: pd.DataFrame, column: str, tie_pct: float) -> str:
    """Policies best first by ``column``; neighbours within ``tie_pct`` percent of each
    other are a tie, joined by ``=``. A tie is not an order, so the live and simulated
    rankings are identical only if they also tie alike (a replay that gives two policies
    the same steps/hour to 1e-7 does not rank them, whichever it happens to list first)."""
    rows = rank.sort_values(column, ascending=False)
    groups: list[list[str]] = []
    prev = None
    for policy, value in zip(rows["policy"], rows[column], strict=True):
        if prev is not None and math.isclose(value, prev, rel_tol=tie_pct / 100.0):
            groups[-1].append(policy)
        else:
            groups.append([policy])
        prev = value
    return " > ".join(" = ".join(sorted(g)) for g in groups)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--cost", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path("out/bench-fidelity"))
    ap.add_argument("--tie-pct", type=float, default=0.1,
                    help="steps/hour within this percent of each other rank as a tie (default 0.1)")
    args = ap.parse_args(argv)
    cost = CostModel.from_file(args.cost) if args.cost else CostModel()
    by_policy: dict[str, list] = defaultdict(list)
    errors: list[pd.DataFrame] = []
    t0 = time.perf_counter()
    for run in args.runs:
        r = fidelity(run, cost, args.out / run.name, force=True)
        write_fidelity_report(r, args.out / run.name, cost_file=args.cost)
        by_policy[r.summary["policy"]].append(r)
        errors.append(r.steps.assign(run=run.name, policy=r.summary["policy"]))
        print(f"{run.name:<24} {r.summary['policy']:<12} steps={r.summary['steps']} "
              f"median err {r.summary['median_abs_error_pct']:5.1f}%  max {r.summary['max_abs_error_pct']:5.1f}%  "
              f"order {'same' if r.summary['order_identical'] else 'DIFFERS: ' + r.summary['order_first_difference']}")
    allsteps = pd.concat(errors, ignore_index=True)
    e = allsteps["abs_error_pct"].to_numpy()
    print(f"\nper-step error over {len(e)} steps of {len(args.runs)} runs: median {np.median(e):.1f}%  "
          f"p90 {np.percentile(e, 90):.1f}%  max {e.max():.1f}%  (signed mean {allsteps['signed_error_pct'].mean():+.1f}%)")
    print("\nlive run-to-run spread (same policy and config):")
    spreads = []
    for policy, rs in by_policy.items():
        if len(rs) < 2:
            continue
        st = step_table(rs[0].live, rs[0].sim, rs[1].live)
        spreads.append(st["spread_pct"].to_numpy())
        print(f"  {policy:<12} per-step spread median {st['spread_pct'].median():.1f}%  max {st['spread_pct'].max():.1f}%  "
              f"(steps/hour {steps_per_hour(rs[0].live):.1f} vs {steps_per_hour(rs[1].live):.1f})")
    if not spreads:
        print("  (no policy was run twice: no spread)")
    print("\nranking (steps/hour):")
    rows = []
    for policy, rs in by_policy.items():
        rows.append({"policy": policy, "live": float(np.mean([steps_per_hour(r.live) for r in rs])),
                     "sim": float(np.mean([steps_per_hour(r.sim) for r in rs])), "runs": len(rs)})
    rank = pd.DataFrame(rows)
    for _, row in rank.iterrows():
        print(f"  {row['policy']:<12} live {row['live']:8.1f}  sim {row['sim']:8.1f}  ({row['runs']} run(s))")
    live_order, sim_order = ordered(rank, "live", args.tie_pct), ordered(rank, "sim", args.tie_pct)
    print(f"  (steps/hour within {args.tie_pct:g}% of each other: a tie, '=')")
    print(f"  live order: {live_order}\n  sim order:  {sim_order}\n  "
          f"ranking {'IDENTICAL' if live_order == sim_order else 'DIFFERS'}")
    allsteps.to_csv(args.out / "all_steps.csv", index=False)
    rank.to_csv(args.out / "ranking.csv", index=False)
    print(f"\n({time.perf_counter() - t0:.1f}s; per-run reports under {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
