"""Issue 10 bench: how long ``rlsched plan`` takes for a 64-GPU run on the shipped sample
trace with its default budget, and what the time buys (trials, simulations, phases).

    python bench/bench_plan.py                     # defaults: 2-minute budget, 2 workers
    python bench/bench_plan.py --budget-minutes 5  # a longer search

The plan is written to a temporary folder and removed afterwards (``--keep DIR`` keeps it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from rlsched.cluster.config import RunConfig
from rlsched.plan import PlanRequest, plan
from rlsched.sim.cost import CostModel
from rlsched.traces import load_trace, sample_trace_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--budget-minutes", type=float, default=PlanRequest.budget_minutes)
    ap.add_argument("--workers", type=int, default=PlanRequest.workers)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", type=Path, default=None, help="write the plan here and keep it")
    args = ap.parse_args()

    path = sample_trace_path()
    req = PlanRequest(trace_path=path, trace=load_trace(path), run=RunConfig(gpus=args.gpus, seed=args.seed),
                      cost=CostModel(), budget_minutes=args.budget_minutes, workers=args.workers,
                      seed=args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="bench-plan-"))
    out = args.keep or tmp / "plan"
    t0 = time.perf_counter()
    try:
        res = plan(req, out, force=args.keep is not None)
        wall = time.perf_counter() - t0
        meta = json.loads((out / "plan.json").read_text())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    c = res.search.counts
    print(f"## rlsched plan: {path.name}, {args.gpus} GPUs, budget {args.budget_minutes:g} min, "
          f"{args.workers} workers\n")
    print(f"wall time: {wall:.1f} s (budget {60 * args.budget_minutes:.0f} s)")
    print("phases: " + ", ".join(f"{k} {v:.1f} s" for k, v in meta["phase_seconds"].items()))
    print(f"search: {res.search.distinct} configurations ({c['complete']} full-length, {c['pruned']} "
          f"pruned, {c['rejected']} rejected; {len(res.search.trials)} asks), stopped by "
          f"{res.search.stopped_by}")
    print(f"simulations: {res.simulations} ({meta['simulated_cpu_seconds']:.0f} s of simulator time, "
          f"{meta['simulated_cpu_seconds'] / max(1, res.simulations):.2f} s each)")
    print(f"recommended: {res.recommended}\n")
    print("| # | policy | steps/h | mean | std | min | util | gap % |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for _, r in res.ranking[res.ranking["feasible"]].head(8).iterrows():
        spread = (f"{r['sph_mean']:.3f} | {r['sph_std']:.3f} | {r['sph_min']:.3f}"
                  if r["resamples"] else " | | ")
        print(f"| {r['rank']} | {r['policy']} | {r['steps_per_hour']:.3f} | {spread} | "
              f"{r['utilization']:.3f} | {r['gap_to_bound_pct']:.1f} |")
    for note in res.notes:
        print(f"\nnote: {note}")


if __name__ == "__main__":  # the plan's worker processes are spawned: guard the entry point
    main()
