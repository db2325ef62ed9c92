"""Issue 7 bench: the simulator at the reference system's scale, against a bare SimPy loop.

Prints three things (no timed tests; figures depend on the machine):

1. seed scale -- the ``swe-seed`` trace (3.9M turns, 24,576 trajectories, contexts up to
   ~1M tokens) on 1024 GPUs (tp=4), 512 trajectories per step, every shipped policy at its
   default parameters plus ``async:rollout_fraction=0.5,staleness=1``. Each policy runs in
   a fresh subprocess (so peak RSS is its own), writing its run record to a temporary
   folder: load time, simulation time, ``simulate()`` time (adds the lower bound and the
   record), events and events/s, peak RSS;
2. the same trajectories and turns through a bare SimPy loop (``bare_simpy.py``: one
   process per trajectory, two timeouts per turn), run in each policy's process just
   before and just after it (same conditions; their mean), and the ratio -- for the same work (simulation time /
   bare time) and per event; plus the bare loop alone in its own process;
3. growth: simulation time while doubling turns per trajectory, multiplying tokens per
   turn by 10 and 100, doubling GPUs and doubling trajectories per step, with the fitted
   exponent of each (least squares on log-log; best of three runs per point).

    python bench/bench_scale.py            # 48 steps (many minutes: run it alone)
    python bench/bench_scale.py --quick    # 4 steps, fewer growth points
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
SEED_GPUS, SEED_TP, TASKS_PER_STEP = 1024, 4, 64
ASYNC = "async:rollout_fraction=0.5,staleness=1"


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


# --------------------------------------------------------------------- children
def _load(trace: str, steps: int):
    from rlsched.sim.workload import replay_workload

    return replay_workload(trace, steps, TASKS_PER_STEP, stream_rows=0)


def child_policy(spec: str, trace: str, steps: int) -> dict:
    from rlsched.cluster.config import RunConfig
    from rlsched.policies import make_policy
    from rlsched.sim import compiled
    from rlsched.sim.cost import CostModel
    from rlsched.sim.run import simulate

    sys.path.insert(0, str(HERE))
    from bare_simpy import bare_run

    t0 = time.perf_counter()
    workload, batches = _load(trace, steps)
    t_load = time.perf_counter() - t0
    # the bare loop over the same turns, in this process just before the run and again
    # just after it, so the ratio is measured under the same conditions (gc paused, as
    # the simulator does) and a drift of the machine's speed shows as two different times
    c0 = time.process_time()
    bare_before, bare_events = bare_run(workload, batches, gc_off=True)
    bare_cpu_before = time.process_time() - c0
    start = time.perf_counter()

    def progress(done: int, total: int, now: float) -> None:
        if done == total or done % max(1, total // 8) == 0:
            print(f"  [{spec}] step {done}/{total}  sim t={now:,.0f}s  "
                  f"wall {time.perf_counter() - start:,.1f}s", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as d:
        t1, c1 = time.perf_counter(), time.process_time()
        out = simulate(workload, batches, make_policy(spec),
                       RunConfig(gpus=SEED_GPUS, tp=SEED_TP, steps=steps), CostModel(),
                       out_dir=Path(d) / "run", spec=spec, progress=progress)
        t_simulate, cpu_simulate = time.perf_counter() - t1, time.process_time() - c1
        meta = json.loads((Path(d) / "run" / "meta.json").read_text())
    r = out.result
    c0 = time.process_time()
    bare_after, _ = bare_run(workload, batches, gc_off=True)
    bare_cpu = (bare_cpu_before + time.process_time() - c0) / 2
    bare_s = (bare_before + bare_after) / 2
    return {
        "spec": spec, "steps": steps, "complete": r.complete, "load_s": t_load,
        "sim_s": r.wall_seconds, "simulate_s": t_simulate, "events": r.events_processed,
        "turns": int(sum(ts.turns_done for ts in r.state.trajs.values())),
        "makespan": r.makespan, "record_complete": meta["complete"], "rss_mb": _peak_rss_mb(),
        "bare_s": bare_s, "bare_before_s": bare_before, "bare_after_s": bare_after,
        "bare_events": bare_events, "bare_cpu": bare_cpu, "simulate_cpu": cpu_simulate,
        "compiled": list(compiled()),
    }


def child_bare(trace: str, steps: int) -> dict:
    sys.path.insert(0, str(HERE))
    from bare_simpy import bare_run

    t0 = time.perf_counter()
    workload, batches = _load(trace, steps)
    t_load = time.perf_counter() - t0
    wall, events = bare_run(workload, batches)
    wall_off, _ = bare_run(workload, batches, gc_off=True)
    turns = int(sum(workload.turns[workload.index[t]] for b in batches for _, t in b))
    return {"spec": "bare SimPy loop", "load_s": t_load, "sim_s": wall, "sim_gc_off_s": wall_off,
            "events": events, "turns": turns, "rss_mb": _peak_rss_mb()}


def run_child(args: list[str]) -> dict:
    """Run this script as a fresh process (``--_child ...``); its last stdout line is JSON."""
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args],
                          stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ seed scale
def seed_scale(trace: str, steps: int, specs: list[str]) -> None:
    bare = run_child(["--_bare", trace, str(steps)])
    rows = [run_child(["--_child", spec, trace, str(steps)]) for spec in specs]
    print(f"\n## Seed scale: swe-seed, {SEED_GPUS} GPUs (tp={SEED_TP}), {steps} steps, "
          f"{TASKS_PER_STEP * 8} trajectories/step\n")
    print(f"inner loop: {'compiled (' + ', '.join(rows[0]['compiled']) + ')' if rows and rows[0]['compiled'] else 'pure Python'}\n")
    print("| run | turns | events | load s | sim s | simulate s | events/s | us/event | "
          "bare s (before, after) | sim / bare | per event / bare | CPU simulate / bare | peak RSS MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        us = r["sim_s"] / r["events"] * 1e6
        b_us = r["bare_s"] / r["bare_events"] * 1e6
        flag = "" if r["complete"] and r["record_complete"] else " (INCOMPLETE)"
        print(f"| {r['spec']}{flag} | {r['turns']:,} | {r['events']:,} | {r['load_s']:.1f} | "
              f"{r['sim_s']:.1f} | {r['simulate_s']:.1f} | {r['events'] / r['sim_s']:,.0f} | "
              f"{us:.2f} | {r['bare_s']:.1f} ({r['bare_before_s']:.1f}, {r['bare_after_s']:.1f}) | {r['sim_s'] / r['bare_s']:.2f}x | {us / b_us:.2f}x | "
              f"{r['simulate_cpu'] / r['bare_cpu']:.2f}x | {r['rss_mb']:,.0f} |")
    b_us = bare["sim_s"] / bare["events"] * 1e6
    print(f"| {bare['spec']} (own process, gc on) | {bare['turns']:,} | {bare['events']:,} | "
          f"{bare['load_s']:.1f} | {bare['sim_s']:.1f} | - | {bare['events'] / bare['sim_s']:,.0f} | "
          f"{b_us:.2f} | {bare['sim_gc_off_s']:.1f} (gc paused) | - | - | - | {bare['rss_mb']:,.0f} |")
    print("\nsim s: the simulation itself (SimDriver.run); simulate s: plus the lower bound, "
          "checks and writing the run record. bare s: the bare SimPy loop over the same "
          "trajectories and turns (two timeouts per turn, gc paused as in the simulator), run "
          "in the policy's own process just before and just after it (mean; the two differ "
          "when the machine's speed drifts); the ratios compare sim s with it (CPU: "
          "process time of simulate(), i.e. with bound and record, over the bare loop's).")


# ---------------------------------------------------------------------- growth
def synthetic(n_traj: int, turns: int, tokens: float, steps: int, seed: int = 0):
    """``steps`` x ``n_traj`` trajectories of ``turns`` turns each: prompts ~20 x tokens
    (the first turn 10x that), outputs ~10 x tokens, tool calls 1-10 s."""
    from rlsched.sim.workload import Workload

    rng = np.random.default_rng(seed)
    n = steps * n_traj
    rows = n * turns
    prompt = np.maximum(1, rng.poisson(20 * tokens, rows))
    prompt[::turns] *= 10
    output = np.maximum(1, rng.poisson(10 * tokens, rows))
    ids = np.repeat(np.array([f"g{i:06d}" for i in range(n)], dtype=object), turns)
    df = pd.DataFrame({
        "task_id": ids, "trajectory_id": ids, "turn": np.tile(np.arange(turns), n),
        "prompt_tokens": prompt, "output_tokens": output,
        "env_seconds": rng.uniform(1.0, 10.0, rows),
    })
    w = Workload.from_frame(df)
    ids_u = w.trajectory_ids
    return w, [[(t, t) for t in ids_u[s * n_traj:(s + 1) * n_traj]] for s in range(steps)]


def growth_point(spec: str, gpus: int, n_traj: int, turns: int, tokens: float, steps: int) -> tuple[float, int]:
    from rlsched.cluster.config import RunConfig
    from rlsched.policies import make_policy
    from rlsched.sim.cost import CostModel
    from rlsched.sim.driver import SimDriver

    w, batches = synthetic(n_traj, turns, tokens, steps)
    best, events = float("inf"), 0
    for _ in range(3):
        r = SimDriver(w, batches, make_policy(spec), RunConfig(gpus=gpus, tp=4, steps=steps),
                      CostModel()).run()
        best, events = min(best, r.wall_seconds), r.events_processed
    return best, events


def growth(specs: list[str], quick: bool) -> None:
    # the base point takes ~0.1 s, so a fixed per-run cost cannot hide a super-linear term
    # (with a 30 ms base it made the fitted exponents look lower than they are)
    base = {"gpus": 64, "n_traj": 64 if quick else 256, "turns": 32 if quick else 128, "tokens": 1.0}
    n = 3 if quick else 4
    axes = {
        "turns per trajectory": ("turns", [base["turns"] * 2**k for k in range(n)]),
        "tokens per turn": ("tokens", [1.0, 10.0, 100.0]),
        "GPUs": ("gpus", [base["gpus"] * 2**k for k in range(n)]),
        "trajectories per step": ("n_traj", [base["n_traj"] * 2**k for k in range(n)]),
    }
    print(f"\n## Growth (2 steps; base: {base['gpus']} GPUs, {base['n_traj']} trajectories/step, "
          f"{base['turns']} turns, ~30 tokens/turn)\n")
    print("| policy | doubling | points (value: sim s, events) | exponent | events exponent |")
    print("|---|---|---|---:|---:|")
    for spec in specs:
        for label, (key, values) in axes.items():
            pts = []
            for v in values:
                cfg = dict(base, **{key: v})
                secs, ev = growth_point(spec, cfg["gpus"], cfg["n_traj"], cfg["turns"], cfg["tokens"], 2)
                pts.append((v, secs, ev))
            x = np.log([p[0] for p in pts])
            slope = float(np.polyfit(x, np.log([p[1] for p in pts]), 1)[0])
            ev_slope = float(np.polyfit(x, np.log([p[2] for p in pts]), 1)[0])
            shown = ", ".join(f"{v:g}: {s:.2f}s {e:,}" for v, s, e in pts)
            print(f"| {spec} | {label} | {shown} | {slope:.2f} | {ev_slope:.2f} |", flush=True)
    print("\nTargets: exponent <= 1.1 in turns, <= 0.1 in tokens per turn. The events exponent "
          "separates more work (events) from more time per event.")


# ------------------------------------------------------------------------ main
def make_trace(path: Path) -> None:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import sys; from rlsched.cli import main; sys.exit(main())",
                    "trace", "gen", "--preset", "swe-seed", "--seed", "0", "--out", str(path)],
                   check=True, stdout=subprocess.DEVNULL)
    print(f"generated {path.name} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--_child":
        print(json.dumps(child_policy(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--_bare":
        print(json.dumps(child_bare(sys.argv[2], int(sys.argv[3]))))
        return
    from rlsched.policies import available

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 steps at seed scale, 3 growth points")
    ap.add_argument("--steps", type=int, default=None, help="seed-scale steps (default 48, quick 4)")
    ap.add_argument("--trace", type=Path, default=None, help="an existing swe-seed trace")
    ap.add_argument("--policies", default=None, help="comma-separated specs (default: all shipped)")
    ap.add_argument("--skip-seed", action="store_true")
    ap.add_argument("--skip-growth", action="store_true")
    a = ap.parse_args()
    steps = a.steps or (4 if a.quick else 48)
    # every shipped policy at its defaults; async as rollout_fraction=0.5, staleness=1
    specs = a.policies.split(",") if a.policies else [ASYNC if n == "async" else n for n in available()]
    t0 = time.time()
    print(f"# bench_scale: python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as d:
        if not a.skip_seed:
            trace = a.trace or Path(d) / "swe-seed.parquet"
            if a.trace is None:
                make_trace(trace)
            seed_scale(str(trace), steps, specs)
    if not a.skip_growth:
        growth(["colocated"] if a.quick else specs, a.quick)
    print(f"\nbench wall time: {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
