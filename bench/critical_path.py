"""What holds each step back, per policy: the steps of a run along their critical path.

The elastic bench's gap to the bound by cause shares the gap out by lost GPU-time, which
at staleness 0 names the trainer's idle GPUs first -- though giving them work would not end
any step sooner: each step ends when its longest trajectory does. This script runs each
policy on the same inputs as the elastic bench and splits every step's time, from the
previous step's end to its own, into (``rlsched.analysis.critical``): the start delay
(switches back to rollout, syncs), the longest solo (its longest trajectory alone on an
engine: what no schedule avoids), the tail slowdown (the rest of the rollout's span: the
last trajectories running slower than alone) and what is left after the rollout (training,
the optimizer step). At staleness 0 the four sum to the run; with staleness the steps
overlap and each row still says what its own rollout and training took.

Usage::

    python bench/critical_path.py                                  # shipped trace, 64 GPUs
    python bench/critical_path.py --traces longtail,growing --gpus 64,256 --per-step
    python bench/critical_path.py --traces none --trace-file real.parquet --policies elastic

Simulated seconds are deterministic; nothing here is timed on the host.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from bench_elastic import bench_inputs, bench_policy, trace_file_step

from rlsched.analysis.critical import critical_path, critical_totals
from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import RlschedError
from rlsched.cluster.record import read_run
from rlsched.sim.presets import default_cost
from rlsched.sim.run import simulate
from rlsched.traces import generate_trace, sample_trace_path, write_trace

TP = 4  # the elastic bench's engines


def run(trace: str, spec: str, gpus: int, steps: int, tasks: int, per_step: bool) -> None:
    w, b, turns = bench_inputs(trace, steps, tasks)
    with tempfile.TemporaryDirectory() as d:
        out = simulate(w, b, bench_policy(spec, turns), RunConfig(gpus=gpus, tp=TP, steps=steps),
                       default_cost(), out_dir=Path(d) / "run")
        record = read_run(Path(d) / "run")
    table = critical_path(record)  # (the solo times: the record's solo_seconds column)
    tot = critical_totals(table)
    makespan, bound = out.result.makespan, out.lower_bound_seconds
    over = tot["period_s"] - tot["longest_solo_s"]  # the steps' time beyond their longest solo
    share = (lambda x: f"{x:8.0f} ({100 * x / over:3.0f}%)") if over > 0 else (lambda x: f"{x:8.0f}")
    print(f"| {spec} | {makespan:.0f} | {bound:.0f} | {100 * (makespan / bound - 1):.1f}% | "
          f"{tot['longest_solo_s']:.0f} | {share(tot['start_delay_s'])} | {share(tot['tail_slowdown_s'])} | "
          f"{share(tot['after_rollout_s'])} |")
    if per_step:
        print("\n| step | start delay s | longest solo s | tail slowdown s | after rollout s | period s | last to finish |")
        print("|---:|---:|---:|---:|---:|---:|---|")
        for r in table.itertuples():
            print(f"| {r.step} | {r.start_delay_s:.1f} | {r.longest_solo_s:.1f} | {r.tail_slowdown_s:.1f} | "
                  f"{r.after_rollout_s:.1f} | {r.period_s:.1f} | {r.last_trajectory} |")
        print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", default="64", help="cluster sizes, comma-separated")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--traces", default="longtail", help="any of longtail, seed, growing (the elastic "
                    "bench's); 'none' for only --trace-file")
    ap.add_argument("--trace-file", action="append", default=[], metavar="PATH", help="also this trace file; repeatable")
    ap.add_argument("--seed-turns-scale", type=float, default=0.25)
    ap.add_argument("--policies", default="colocated,elastic,elastic:staleness=1",
                    help="policy specs, comma-separated between specs (a spec's own commas: use ';')")
    ap.add_argument("--per-step", action="store_true", help="also print every step's row")
    a = ap.parse_args()
    specs = [s.replace(";", ",") for s in a.policies.split(",") if s]
    names = [n for n in a.traces.split(",") if n not in ("", "none")]
    if not names and not a.trace_file:
        ap.error("--traces none: give at least one --trace-file")
    try:
        sizes = [int(g) for g in a.gpus.split(",")]
    except ValueError:
        ap.error(f"--gpus {a.gpus!r}: expected whole numbers, comma-separated")
    with tempfile.TemporaryDirectory() as d:
        jobs: list[tuple[str, str, int, int]] = []  # (path, label, gpus, tasks per step)
        for gpus in sizes:
            tasks = a.steps * 16 * gpus // 64
            for name in names:
                if name == "longtail":
                    jobs.append((str(sample_trace_path()), "longtail-small (shipped)", gpus, 16 * gpus // 64))
                elif name in ("seed", "growing"):
                    path = str(Path(d) / f"{name}-{gpus}.parquet")
                    kw = {"turns_scale": a.seed_turns_scale} if name == "seed" else {}
                    write_trace(generate_trace("swe-seed" if name == "seed" else "longtail-growing",
                                               seed=0, tasks=tasks, **kw), path)
                    jobs.append((path, name, gpus, 16 * gpus // 64))
                else:
                    ap.error(f"--traces: unknown trace {name!r} (expected longtail, seed, growing or none)")
            for path in a.trace_file:
                try:
                    per, _, _ = trace_file_step(path, gpus)
                except RlschedError as e:
                    ap.error(f"--trace-file {path}: {e}")
                jobs.append((path, Path(path).stem, gpus, per))
        for path, label, gpus, tasks in jobs:
            print(f"\n### {label}: {gpus} GPUs, {a.steps} steps, {tasks} tasks a step\n")
            print("| policy | sim s | bound s | gap | longest solo s | start delay s | tail slowdown s | "
                  "after rollout s |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|")
            for spec in specs:
                try:
                    run(path, spec, gpus, a.steps, tasks, a.per_step)
                except RlschedError as e:
                    sys.exit(f"critical_path: {spec} on {label}: {e}")
    print("\n(shares: of the steps' time beyond their longest solo; with staleness the steps overlap, "
          "so the parts sum to more than the run)")


if __name__ == "__main__":
    main()
