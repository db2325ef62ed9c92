"""Issue 9 bench: fault injection in the simulator -- nothing is lost, and what faults cost.

1. The fault-injection matrix (default): every shipped policy on the shipped trace
   ``traces/data/longtail-small.parquet`` (the ``rlsched compare`` defaults: 64 GPUs,
   tp=4, 4 steps), once without faults and once per fault kind (and all kinds together),
   with invariants checked during each run (``check=True``). Per cell: faults fired,
   trajectories retried, simulated time lost against the fault-free run, GPU-seconds of
   work thrown away, and ``lost_trajectories`` from the run record's summary (must be 0).
2. ``--soak``: the seed-scale preset (``swe-seed`` trace, 1024 GPUs, tp=4, 64 tasks x 8
   samples per step, like ``bench_scale.py``) with one GPU failure per simulated hour
   (recovering after ``recover_s``), invariants checked; prints lost trajectories, faults,
   retries and wall time. Many minutes per policy: run it alone.

    python bench/bench_faults.py                            # the matrix (~half a minute)
    python bench/bench_faults.py --soak --policies elastic  # seed-scale soak, 48 steps
    python bench/bench_faults.py --soak --steps 8 --trace swe-seed.parquet
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlsched.analysis.metrics import summarize
from rlsched.cluster.config import RunConfig
from rlsched.cluster.faults import Fault, FaultSchedule
from rlsched.cluster.record import read_run
from rlsched.policies import make_policy
from rlsched.sim.cost import CostModel
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload
from rlsched.traces import draw_batches, load_trace, sample_trace_path

SPECS = ["colocated", "async:rollout_fraction=0.5,staleness=1", "elastic", "partial"]
RECOVER_S = 600.0
# per kind: six an hour, so a ~1-hour run is hit several times
MATRIX: dict[str, tuple[Fault, ...]] = {
    "gpu": (Fault("gpu", per_hour=6.0),),
    "trainer": (Fault("trainer", per_hour=6.0),),
    "tool": (Fault("tool", per_hour=6.0),),
    "sync": (Fault("sync", per_hour=6.0),),
}
MATRIX["all"] = tuple(f for fs in MATRIX.values() for f in fs)
SEED_GPUS, SEED_TP, TASKS_PER_STEP = 1024, 4, 64


def run_one(workload: Workload, batches: list, spec: str, config: RunConfig, out: Path,
            faults: FaultSchedule | None) -> dict:
    t0 = time.perf_counter()
    res = simulate(workload, batches, make_policy(spec), config, CostModel(), out_dir=out, spec=spec,
                   faults=faults).result
    wall = time.perf_counter() - t0
    row = summarize(read_run(out))
    return {"makespan": res.makespan, "complete": res.complete, "wall": wall, "row": row, "stats": res.faults}


def matrix(seed: int) -> None:
    df = load_trace(sample_trace_path())
    config = RunConfig(gpus=64, tp=4, steps=4, check=True)
    batches = draw_batches(df, config.steps, config.tasks_per_step, config.samples_per_task)
    workload = Workload.from_frame(df)
    print(f"## Fault-injection matrix: longtail-small, {config.gpus} GPUs (tp={config.tp}), "
          f"{config.steps} steps, seed {seed}, recover_s={RECOVER_S:g}, invariants checked\n")
    print("| policy | fault | fired | retried trajectories | time lost s | time lost % | "
          "fault GPU-s lost | failed GPU-s | wasted tokens | tool s lost | lost_trajectories |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as d:
        for spec in SPECS:
            base = run_one(workload, batches, spec, config, Path(d) / "base", None)
            print(f"| {spec} | none | 0 | 0 | 0 (makespan {base['makespan']:,.0f} s) | 0.0 | 0 | 0 | 0 | 0 | "
                  f"{base['row']['lost_trajectories']} |", flush=True)
            for kind, faults in MATRIX.items():
                sched = FaultSchedule(faults, seed=seed, recover_s=RECOVER_S)
                r = run_one(workload, batches, spec, config, Path(d) / kind, sched)
                row = r["row"]
                lost = r["makespan"] - base["makespan"]
                flag = "" if r["complete"] else " (INCOMPLETE)"
                print(f"| {spec}{flag} | {kind} | {row['faults']} | {row['retried_trajectories']} | "
                      f"{lost:,.0f} | {100 * lost / base['makespan']:.1f} | {row['fault_gpu_seconds_lost']:,.0f} | "
                      f"{row['failed_gpu_seconds']:,.0f} | {row['fault_wasted_tokens']:,} | "
                      f"{row['fault_tool_seconds_lost']:,.0f} | {row['lost_trajectories']} |", flush=True)
    print("\nfired: faults that fired during the run (a sync fault arms the next weight sync; "
          "colocated and partial never sync, so theirs never hit). time lost: makespan minus "
          "the same run without faults (it can be negative: a fault reshuffles work). fault GPU-s "
          "lost: trainer work re-run, trainer restarts and failed syncs.")


def make_trace(path: Path) -> None:
    subprocess.run([sys.executable, "-c", "import sys; from rlsched.cli import main; sys.exit(main())",
                    "trace", "gen", "--preset", "swe-seed", "--seed", "0", "--out", str(path)],
                   check=True, stdout=subprocess.DEVNULL)


def soak(trace: Path | None, steps: int, specs: list[str], seed: int, per_hour: float) -> None:
    from rlsched.sim.workload import load_workload, trace_index

    with tempfile.TemporaryDirectory() as d:
        if trace is None:
            trace = Path(d) / "swe-seed.parquet"
            t0 = time.perf_counter()
            make_trace(trace)
            print(f"generated swe-seed trace in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        idx = trace_index(str(trace))
        batches = draw_batches(idx, steps, tasks_per_step=TASKS_PER_STEP)
        workload = load_workload(str(trace), batches, idx)
        config = RunConfig(gpus=SEED_GPUS, tp=SEED_TP, steps=steps, check=True)
        sched = FaultSchedule((Fault("gpu", per_hour=per_hour),), seed=seed, recover_s=RECOVER_S)
        print(f"## Soak: swe-seed, {SEED_GPUS} GPUs (tp={SEED_TP}), {steps} steps, "
              f"{TASKS_PER_STEP * 8} trajectories/step, {per_hour:g} GPU failure(s) per simulated hour "
              f"(recover {RECOVER_S:g} s), seed {seed}, invariants checked\n")
        print("| policy | complete | simulated h | GPU failures | retried trajectories | wasted tokens | "
              "failed GPU-s | fault GPU-s lost | lost_trajectories | wall s |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for spec in specs:
            r = run_one(workload, batches, spec, config, Path(d) / "run", sched)
            row = r["row"]
            print(f"| {spec} | {r['complete']} | {r['makespan'] / 3600:.1f} | {row['faults']} | "
                  f"{row['retried_trajectories']:,} | {row['fault_wasted_tokens']:,} | "
                  f"{row['failed_gpu_seconds']:,.0f} | {row['fault_gpu_seconds_lost']:,.0f} | "
                  f"{row['lost_trajectories']} | {r['wall']:,.0f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--soak", action="store_true", help="seed-scale soak instead of the matrix")
    ap.add_argument("--steps", type=int, default=48, help="soak: optimizer steps (default 48)")
    ap.add_argument("--trace", type=Path, default=None, help="soak: an existing swe-seed trace")
    ap.add_argument("--policies", default=None, help="soak: comma-separated specs (default: all four)")
    ap.add_argument("--per-hour", type=float, default=1.0, help="soak: GPU failures per simulated hour")
    ap.add_argument("--seed", type=int, default=0, help="fault schedule seed")
    a = ap.parse_args()
    t0 = time.time()
    if a.soak:
        soak(a.trace, a.steps, a.policies.split(",") if a.policies else SPECS, a.seed, a.per_hour)
    else:
        matrix(a.seed)
    print(f"\nbench wall time: {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
