"""Do-no-harm sample: is elastic ever slower than the baseline it must not lose to?

Issue 23's first rule: elastic at staleness 0 is never slower than colocated, and at
staleness 1 never slower than the best asynchronous split (``rollout_fraction`` swept
over 0.25..0.75 with hindsight), on any trace and cluster, within 1%. The tests pin the
cases searches found; this script draws a fresh random sample of small cases, so the
README's sample figures can be re-run by anyone (``--seed``: the same seed draws the same
cases). Each case draws a trace of the ``--preset`` (its own seed), 4-8 tasks x 2-8 samples
a step, 3 or 6 steps, turns scaled by 0.1 or 0.3, and a cluster of 2-8 engines of tp 2, 4
or 8 (at least 12 GPUs: the default preset's trainer needs 8) -- with ``--cost flat`` (no
gradient reduction, free resharding, no trainer memory floor) of tp 1-8 and no 12-GPU
floor. Every policy replays the same tasks on the same cost model.

Prints one line per case (its draw, then seconds: colocated, elastic at k=0 and its gap,
the best async and elastic at k=1 and its gap; a positive gap is elastic behind) and a
summary: cases over the tolerance, the worst gap and the mean ratio per staleness.
``--csv`` writes the same as a table. Runs take seconds to minutes each (``--workers``).

    python bench/no_harm.py --preset uniform --cases 40 --seed 1
    python bench/no_harm.py --preset uniform --cases 30 --seed 2 --cost flat
    python bench/no_harm.py --preset uniform --cases 40 --seed 1 --k1 elastic:staleness=1,train_share=0.5,settle=true
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import math
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import astuple, dataclass, fields

from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import RlschedError
from rlsched.policies import make_policy
from rlsched.sim.cost import CostModel
from rlsched.sim.presets import default_cost
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload
from rlsched.traces import PRESETS, draw_batches, generate_trace

FRACTIONS = (0.25, 0.375, 0.5, 0.625, 0.75)


@dataclass(frozen=True)
class Case:
    preset: str
    seed: int
    tasks: int
    samples: int
    tp: int
    engines: int
    steps: int
    turns_scale: float


def draw_cases(preset: str, n: int, seed: int, flat: bool) -> list[Case]:
    """``n`` cases from ``seed`` (the draw order is part of the contract: the README's
    figures name a seed, and the same seed must draw the same cases)."""
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        tp = rng.choice([1, 2, 4, 8]) if flat else rng.choice([2, 4, 8])
        engines = rng.choice([2, 3, 4, 8])
        while not flat and tp * engines < 12:
            engines += 1
        trace_seed, tasks, samples = rng.randint(0, 10**6), rng.choice([4, 6, 8]), rng.choice([2, 4, 8])
        cases.append(Case(preset, trace_seed, tasks, samples, tp, engines, rng.choice([3, 6]), rng.choice([0.1, 0.3])))
    return cases


@dataclass(frozen=True)
class Outcome:
    colocated: float
    elastic_k0: float
    best_async: float
    best_fraction: float
    elastic_k1: float

    @property
    def gap_k0(self) -> float:
        return self.elastic_k0 / self.colocated - 1.0

    @property
    def gap_k1(self) -> float:
        return self.elastic_k1 / self.best_async - 1.0 if self.best_async == self.best_async else math.nan


def run_case(job: tuple[Case, bool, str, str]) -> tuple[Case, Outcome]:
    case, flat, k0, k1 = job
    df = generate_trace(case.preset, seed=case.seed, tasks=case.tasks * case.steps, samples=case.samples,
                        turns_scale=case.turns_scale)
    workload, batches = Workload.from_frame(df), draw_batches(df, case.steps, case.tasks)
    cfg = RunConfig(gpus=case.tp * case.engines, tp=case.tp, steps=case.steps)
    cost = CostModel() if flat else default_cost()

    def seconds(spec: str) -> float:
        result = simulate(workload, batches, make_policy(spec), cfg, cost).result
        if not result.complete:
            raise SystemExit(f"no_harm: {spec} did not complete {case}")
        return result.makespan

    asyncs = {}
    for f in FRACTIONS:
        with contextlib.suppress(RlschedError):  # (a split this cluster cannot hold: no baseline)
            asyncs[f] = seconds(f"async:rollout_fraction={f},staleness=1")
    best = min(asyncs, key=asyncs.__getitem__) if asyncs else math.nan
    return case, Outcome(seconds("colocated"), seconds(k0), asyncs.get(best, math.nan), best, seconds(k1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument("--cases", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cost", choices=("default", "flat"), default="default")
    ap.add_argument("--k0", default="elastic", help="the staleness-0 spec held to colocated")
    ap.add_argument("--k1", default="elastic:staleness=1", help="the staleness-1 spec held to the best async")
    ap.add_argument("--tolerance", type=float, default=0.01)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--csv", help="also write the cases and seconds to this CSV file")
    a = ap.parse_args(argv)
    if a.cases < 1 or a.workers < 1:
        ap.error("--cases and --workers must be at least 1")
    for spec in (a.k0, a.k1):
        try:
            make_policy(spec)
        except RlschedError as e:
            ap.error(str(e))
    flat = a.cost == "flat"
    cases = draw_cases(a.preset, a.cases, a.seed, flat)
    rows: list[tuple[Case, Outcome]] = []
    t0 = time.time()
    with ProcessPoolExecutor(a.workers) as ex:
        for i, (case, o) in enumerate(ex.map(run_case, [(c, flat, a.k0, a.k1) for c in cases]), 1):
            rows.append((case, o))
            print(f"{astuple(case)} colocated {o.colocated:.1f} k0 {o.elastic_k0:.1f} ({100 * o.gap_k0:+.2f}%) "
                  f"best_async {o.best_async:.1f} (rollout_fraction={o.best_fraction}) "
                  f"k1 {o.elastic_k1:.1f} ({100 * o.gap_k1:+.2f}%)", flush=True)
            print(f"[{i}/{len(cases)}] {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    for k, gaps in ((0, [o.gap_k0 for _, o in rows]), (1, [o.gap_k1 for _, o in rows])):
        ok = [g for g in gaps if g == g]
        over = sum(g > a.tolerance for g in ok)
        print(f"staleness {k}: {over} of {len(ok)} over {100 * a.tolerance:g}% "
              f"(worst {100 * max(ok):+.2f}%, mean ratio {sum(1 + g for g in ok) / len(ok):.4f})")
    if a.csv:
        with open(a.csv, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow([f.name for f in fields(Case)] + [f.name for f in fields(Outcome)] + ["gap_k0", "gap_k1"])
            for case, o in rows:
                w.writerow([*astuple(case), *astuple(o), o.gap_k0, o.gap_k1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
