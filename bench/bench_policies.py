"""Issue 5 bench: elastic vs colocated vs the best async, with an ablation.

Every policy replays the same tasks on the same cost model; async gets its own best
``rollout_fraction`` (swept 0.25..0.75) at each staleness <= 1, and the best value is
reported. Prints one table per (trace, cluster size) and the ratios. Run:

    python bench/bench_policies.py            # shipped long-tail sample + seed-scale slice
    python bench/bench_policies.py --quick    # sample trace only, 64 GPUs
    python bench/bench_policies.py --quick --model qwen2.5-32b --gpu h200   # a cost preset
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rlsched.cluster.config import RunConfig
from rlsched.policies import make_policy
from rlsched.sim.presets import default_cost, preset_cost
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload
from rlsched.traces import draw_batches, generate_trace, load_trace, sample_trace_path, write_trace

FRACTIONS = (0.25, 0.375, 0.5, 0.625, 0.75)
BASE = ["colocated", "elastic", "elastic:staleness=1", "partial"]
ASYNC = [f"async:rollout_fraction={f},staleness={k}" for k in (0, 1) for f in FRACTIONS]
_CACHE: dict[str, tuple] = {}
PRESET: tuple[str | None, str | None] = (None, None)  # --model/--gpu (None: the default cost model)


def _setup(trace: str, steps: int, tasks: int | None):
    key = f"{trace}:{steps}:{tasks}"
    if key not in _CACHE:
        df = load_trace(trace)
        _CACHE[key] = (Workload.from_frame(df), draw_batches(df, steps, tasks))
    return _CACHE[key]


def run_one(args: tuple[str, str, int, int, int | None, bool, tuple[str | None, str | None]]) -> dict:
    trace, spec, gpus, steps, tasks, processor, preset = args
    w, b = _setup(trace, steps, tasks)
    t0 = time.perf_counter()
    cost = preset_cost(*preset) if any(preset) else default_cost()
    out = simulate(w, b, make_policy(spec), RunConfig(gpus=gpus, tp=4, steps=steps, processor=processor), cost)
    r = out.result
    busy = r.gpu_seconds.get("generate", 0.0) + r.gpu_seconds.get("train", 0.0)
    return {
        "spec": spec, "processor": processor, "gpus": gpus,
        "seconds": r.makespan, "steps_per_hour": 3600 * steps / r.makespan,
        "bound": out.lower_bound_seconds, "gap_pct": 100 * (r.makespan / out.lower_bound_seconds - 1),
        "trained_tokens": sum(s["trained_tokens"] for s in r.steps),
        "max_staleness": max((s["max_staleness"] for s in r.steps), default=0),
        "util": busy / (gpus * r.makespan), "wall": time.perf_counter() - t0,
    }


def table(rows: list[dict], title: str) -> None:
    print(f"\n## {title}\n")
    print("| policy | processor | steps/h | sim s | bound s | gap % | util | trained tokens | max stale |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['spec']} | {'on' if r['processor'] else 'off'} | {r['steps_per_hour']:.3f} | "
              f"{r['seconds']:.0f} | {r['bound']:.0f} | {r['gap_pct']:.1f} | {r['util']:.3f} | "
              f"{r['trained_tokens']:,} | {r['max_staleness']} |")


def study(pool: ProcessPoolExecutor, trace: str, label: str, gpus: int, steps: int, tasks: int | None) -> None:
    jobs = [(trace, s, gpus, steps, tasks, False, PRESET) for s in BASE + ASYNC]
    jobs += [(trace, s, gpus, steps, tasks, True, PRESET) for s in ("colocated", "elastic", "elastic:staleness=1")]
    rows = list(pool.map(run_one, jobs))
    main = [r for r in rows if not r["processor"] and not r["spec"].startswith("async")]
    best = {}
    for k in (0, 1):
        cands = [r for r in rows if r["spec"].startswith("async") and r["spec"].endswith(f"staleness={k}")]
        best[k] = max(cands, key=lambda r: r["steps_per_hour"])
    table([*main, best[0], best[1]], f"{label}: {gpus} GPUs, {steps} steps (async: best rollout_fraction per staleness)")
    print("\nasync sweep (steps/h):", ", ".join(
        f"{r['spec'].split(':')[1]}={r['steps_per_hour']:.3f}" for r in rows if r["spec"].startswith("async")))
    by = {r["spec"]: r for r in rows if not r["processor"]}
    col, el, el1 = by["colocated"], by["elastic"], by["elastic:staleness=1"]
    best_async = max(best.values(), key=lambda r: r["steps_per_hour"])
    print(f"\nelastic/colocated = {el['steps_per_hour'] / col['steps_per_hour']:.3f}x   "
          f"elastic(k=1)/colocated = {el1['steps_per_hour'] / col['steps_per_hour']:.3f}x")
    print(f"elastic/best-async = {el['steps_per_hour'] / best_async['steps_per_hour']:.3f}x   "
          f"elastic(k=1)/best-async = {el1['steps_per_hour'] / best_async['steps_per_hour']:.3f}x   "
          f"(best async: {best_async['spec']})")
    toks = {r["spec"]: r["trained_tokens"] for r in rows if not r["processor"]}
    ref = toks["colocated"]
    off = {s: v for s, v in toks.items() if abs(v - ref) > 0.01 * ref}
    print("trained tokens equal within 1% for all policies" if not off else f"trained tokens differ: {off}")
    abl = [r for r in rows if r["processor"]] + [by["elastic"], by["partial"], by["colocated"]]
    table(abl, f"{label}: ablation ({gpus} GPUs) -- processor on/off, partial rollout alone")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed-steps", type=int, default=6, help="steps of the seed-scale slice")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--model", help="model preset (sim/presets.py); default: the default cost model")
    ap.add_argument("--gpu", help="GPU preset (sim/presets.py)")
    a = ap.parse_args()
    global PRESET
    PRESET = (a.model, a.gpu)
    t0 = time.time()
    sample = str(sample_trace_path())
    with ProcessPoolExecutor(a.workers) as pool:
        for gpus in ((64,) if a.quick else (64, 256)):
            study(pool, sample, "longtail-small (shipped)", gpus, 4, None)
        if not a.quick:
            with tempfile.TemporaryDirectory() as d:
                path = Path(d) / "swe-seed.parquet"
                write_trace(generate_trace("swe-seed", seed=0), path)
                for gpus in (64, 256):
                    study(pool, str(path), "swe-seed (seed scale, 512 trajectories/step)", gpus, a.seed_steps, 64)
    print(f"\nbench wall time: {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
