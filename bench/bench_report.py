"""Benchmark: build the HTML report of a seed-scale run (1024 GPUs, 48 steps).

Target (issue 6): under 30 s and 2 GB peak RSS on a 2-core machine. Not a timed test.

    .venv/bin/python bench/bench_report.py                    # synthesise one record
    .venv/bin/python bench/bench_report.py --runs 3           # three policies in one report
    .venv/bin/python bench/bench_report.py --trace T.parquet  # also read a trace (e.g. swe-seed)
    .venv/bin/python bench/bench_report.py --run out/x/runs/00-colocated ...   # real records
    .venv/bin/python bench/bench_report.py --compare swe-seed.parquet   # a whole seed-scale compare

``--compare TRACE`` runs the README's seed-scale four-policy ``rlsched compare`` (1024 GPUs,
tp 4, 48 steps, 64 tasks a step) in a child process under ``/usr/bin/time -v`` and prints its
wall time and peak RSS, the time after the last simulation (summary.csv and the report)
and its share, and the peak RSS when the last simulation ended (the simulations' own
peak). ``--steps`` and ``--policies`` make it smaller.

Without ``--run`` it synthesises a record of realistic size with the real
:class:`~rlsched.cluster.record.RunRecorder` (and says so): 256 engines of 4 GPUs, each
alternating generate (~5.5 s) / tool wait (~7 s) through a long-tailed rollout of every
step, then rollout-idle waiting on the tail, a role switch and a cluster-wide training
step; 512 trajectories per step; ~30 KV evictions per trajectory. Sizes follow a real
2-step seed-scale simulator run (294k intervals per 2 steps, so ~7M for 48 steps), which
takes the simulator ~20 s per step -- too long for a quick bench. The report is built in a child
process so its peak RSS is its own.
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

from rlsched.cluster.record import RunRecorder

GPUS, TP, STEPS, TRAJ_PER_STEP = 1024, 4, 48, 512


def synthesise(path: Path, *, seed: int, policy: str, trace: str = "") -> dict[str, int]:
    rng = np.random.default_rng(seed)
    rec = RunRecorder(path)
    engines = GPUS // TP
    t0 = 0.0
    steps, trajs = [], []
    switch_s, train_s = 8.0, 900.0
    for s in range(STEPS):
        lengths = 3000.0 * np.exp(0.5 * rng.standard_normal(engines))  # long-tailed rollout per engine
        rollout_end = t0 + switch_s + lengths.max()
        for e in range(engines):
            g0 = e * TP
            rec.interval(g0, TP, t0, t0 + switch_s, "switch")
            n = int(lengths[e] / 6.0) + 8
            dur = np.empty(2 * n)
            dur[0::2] = rng.exponential(5.5, n)  # a real seed-scale sim run: generate ~5.5 s,
            dur[1::2] = rng.exponential(7.0, n)  # tool waits ~7 s, ~570 intervals per engine-step
            ends = t0 + switch_s + np.cumsum(dur)
            stop = t0 + switch_s + lengths[e]
            k = int(np.searchsorted(ends, stop)) + 1
            starts = np.concatenate([[t0 + switch_s], ends[: k - 1]])
            ends = np.minimum(ends[:k], stop)
            for i in range(k):
                rec.interval(g0, TP, float(starts[i]), float(ends[i]), "generate" if i % 2 == 0 else "tool_wait")
            rec.interval(g0, TP, stop, rollout_end, "rollout_idle")
            rec.interval(g0, TP, rollout_end, rollout_end + switch_s, "switch")
            for ev_t in np.sort(rng.uniform(t0 + switch_s, stop, rng.poisson(60))):
                rec.event(float(ev_t), "Evict", engine=e, trajectory=f"s{s}-e{e}")
        train_end = rollout_end + switch_s + train_s
        rec.interval(0, GPUS, rollout_end + switch_s, train_end, "train", s)
        for ev_t in np.sort(rng.uniform(t0, rollout_end, 20)):
            rec.event(float(ev_t), "SandboxQueued", trajectory=f"s{s}")
            rec.event(float(ev_t) + 3.0, "SandboxAcquired", trajectory=f"s{s}")
        fin = t0 + switch_s + rng.uniform(0.2, 1.0, TRAJ_PER_STEP) * lengths.max()
        for i, f in enumerate(np.sort(fin)):
            rec.event(float(f), "TrajectoryFinished", step=s, trajectory=f"s{s}-{i}")
        rec.event(train_end, "TrainStepFinished", version=s + 1, step=s)
        turns = np.maximum(1, (60 * np.exp(rng.standard_normal(TRAJ_PER_STEP)))).astype(np.int64)
        tokens = turns * 1200
        trajs.append(pd.DataFrame({
            "trajectory": [f"s{s}-{i}" for i in range(TRAJ_PER_STEP)], "task_id": [f"t{s}-{i // 8}" for i in range(TRAJ_PER_STEP)],
            "step": s, "status": "trained", "finish_status": "done", "dispatch_time": t0 + switch_s, "finish_time": fin,
            "trained_version": s, "min_version": s, "max_version": s, "turns_total": turns, "turns_done": turns,
            "prompt_tokens": tokens * 3 // 4, "output_tokens": tokens // 4, "trained_tokens": tokens,
            "wasted_tokens": 0, "dispatches": 1, "migrations": 0,
        }))
        steps.append((s + 1, train_end, TRAJ_PER_STEP, int(tokens.sum()), train_s, 0))
        t0 = train_end
    rec.close(
        pd.concat(trajs, ignore_index=True),
        pd.DataFrame(steps, columns=["version", "time", "trajectories", "trained_tokens", "train_seconds", "max_staleness"]),
        {
            "driver": "sim", "policy": policy, "policy_name": policy.split(":")[0], "num_gpus": GPUS, "tp": TP,
            "num_steps": STEPS, "steps_done": STEPS, "complete": True, "makespan_seconds": t0,
            "lower_bound_seconds": 0.6 * t0, "max_staleness_bound": 0, "seed": seed, "trace": trace,
            "config": {"gpus": GPUS, "tp": TP, "steps": STEPS}, "cost_model": {"switch_s": switch_s},
            "events_processed": -1, "synthetic": True,
        },
    )
    return {"intervals": rec.interval_rows, "events": rec.event_rows, "trajectories": STEPS * TRAJ_PER_STEP}


def child_report(run_dirs: list[str], out: str) -> None:
    from rlsched.analysis.report import write_report

    t = time.perf_counter()
    write_report([Path(d) for d in run_dirs], Path(out), title="bench_report")
    secs = time.perf_counter() - t
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"seconds": secs, "cpu_seconds": ru.ru_utime + ru.ru_stime, "peak_rss_mb": ru.ru_maxrss / 1024}))


COMPARE_ARGS = ("--gpus", "1024", "--tp", "4", "--tasks-per-step", "64")


def child_compare(argv: list[str]) -> None:
    """Run ``rlsched compare argv``, timing what follows the last simulation; print one
    JSON line.

    The simulations are timed by wrapping ``rlsched.compare.simulate`` (the name compare
    calls), so everything after the last one -- reading the records, summary.csv, the
    report -- counts as "after the simulations", however compare is built inside: this
    measures the code before and after issue 27 alike."""
    import rlsched.compare as cmp
    from rlsched.cli import main as cli_main

    inner = cmp.simulate
    seen: dict[str, float] = {"simulate_seconds": 0.0}

    def timed(*args: object, **kw: object) -> object:
        t = time.perf_counter()
        try:
            return inner(*args, **kw)  # type: ignore[arg-type]
        finally:
            seen["simulate_seconds"] += time.perf_counter() - t
            seen["last_simulation_end"] = time.perf_counter()
            seen["cpu_at_last_simulation_end"] = time.process_time()
            seen["rss_after_simulations_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    cmp.simulate = timed  # type: ignore[assignment]
    t = time.perf_counter()
    rc = cli_main(argv)
    if rc:
        sys.exit(rc)
    end = time.perf_counter()
    seen["cpu_seconds"] = time.process_time()
    seen["after_simulations_cpu_seconds"] = seen["cpu_seconds"] - seen.pop("cpu_at_last_simulation_end")
    seen["seconds"] = end - t
    seen["after_simulations_seconds"] = end - seen.pop("last_simulation_end")
    print(json.dumps(seen))


def run_compare(trace: str, work: Path, steps: int, policies: str) -> None:
    out = work / "compare"
    argv = ["compare", "--policies", policies, "--trace", trace, *COMPARE_ARGS, "--steps", str(steps),
            "--out", str(out), "--force"]
    print(f"command: rlsched {' '.join(argv)}")
    cmd = [sys.executable, __file__, "--_compare", *argv]
    timer = ["/usr/bin/time", "-v"] if Path("/usr/bin/time").exists() else []
    env = {**os.environ, "RLSCHED_PROGRESS_SECONDS": "600"}
    p = subprocess.run([*timer, *cmd], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(p.stderr[-3000:])
    r = json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1])
    peak = _time_v(p.stderr, "Maximum resident set size (kbytes)")
    peak_mb = peak / 1024 if peak is not None else float("nan")
    after = r["after_simulations_seconds"]
    print(f"compare: {r['seconds']:.1f} s wall, of which simulations {r['simulate_seconds']:.1f} s and "
          f"after the last simulation (summary.csv + report) {after:.1f} s = {100 * after / r['seconds']:.0f}%")
    cpu = r["after_simulations_cpu_seconds"]
    print(f"  CPU time (this process; steadier than wall time on a shared machine): {r['cpu_seconds']:.1f} s, "
          f"after the last simulation {cpu:.1f} s = {100 * cpu / r['cpu_seconds']:.0f}%")
    timing = out / "timing.csv"
    if timing.exists():  # compare's own account (issue 27 on)
        rows = pd.read_csv(timing)
        rep = rows[rows["part"].isin(["report", "summary"])]["wall_seconds"].sum()
        print(f"  timing.csv: report (summary.csv included) {rep:.1f} s = {100 * rep / r['seconds']:.0f}%")
    print(f"peak RSS: {peak_mb:,.0f} MB (/usr/bin/time -v), {r['rss_after_simulations_mb']:,.0f} MB when the "
          f"last simulation ended   (load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")


def _time_v(stderr: str, key: str) -> float | None:
    for line in stderr.splitlines():
        if line.strip().startswith(key):
            return float(line.rsplit(":", 1)[1])
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", nargs="*", default=[], help="real run record(s) to report on")
    ap.add_argument("--runs", type=int, default=1, help="synthetic runs (policies) in the report")
    ap.add_argument("--trace", default="", help="trace path to put in the synthetic meta (report reads it)")
    ap.add_argument("--out", default="", help="folder for the records and report (default: a temp dir)")
    ap.add_argument("--compare", default="", metavar="TRACE", help="time a seed-scale compare of TRACE (see above)")
    ap.add_argument("--steps", type=int, default=48, help="--compare: steps")
    ap.add_argument("--policies", default="colocated,async,elastic,partial", help="--compare: policies")
    ap.add_argument("--_child", nargs="+", help=argparse.SUPPRESS)
    if sys.argv[1:2] == ["--_compare"]:
        child_compare(sys.argv[2:])
        return
    a = ap.parse_args()
    if a.compare:
        run_compare(a.compare, Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="bench_report-")), a.steps, a.policies)
        return
    if a._child:
        child_report(a._child[:-1], a._child[-1])
        return
    work = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="bench_report-"))
    if a.run:
        run_dirs = [str(Path(r)) for r in a.run]
        for d in run_dirs:
            meta = json.loads((Path(d) / "meta.json").read_text())
            kind = "SYNTHETIC" if meta.get("synthetic") else f"real ({meta.get('driver')})"
            print(f"source: {kind} run record {d} ({meta.get('num_gpus')} GPUs, {meta.get('steps_done')} steps)")
    else:
        run_dirs = []
        for i in range(a.runs):
            d = work / "runs" / f"{i:02d}-synthetic"
            t = time.perf_counter()
            sizes = synthesise(d, seed=i, policy=f"synthetic:variant={i}", trace=a.trace)
            print(f"source: SYNTHETIC run record {d} ({GPUS} GPUs, {STEPS} steps; "
                  f"{sizes['intervals']:,} intervals, {sizes['events']:,} events, "
                  f"{sizes['trajectories']:,} trajectories; written in {time.perf_counter() - t:.1f} s)")
            run_dirs.append(str(d))
    out = work / "report"
    p = subprocess.run([sys.executable, __file__, "--_child", *run_dirs, str(out)], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(p.stderr)
    r = json.loads(p.stdout.strip().splitlines()[-1])
    size = (out / "report.html").stat().st_size / 1e6
    verdict = "OK" if r["seconds"] < 30 and r["peak_rss_mb"] < 2048 else "OVER TARGET"
    print(f"report: {out / 'report.html'} ({size:.1f} MB)")
    print(f"build time: {r['seconds']:.1f} s wall ({r['cpu_seconds']:.1f} s CPU, whole child process)   "
          f"peak RSS: {r['peak_rss_mb']:.0f} MB   (target < 30 s, < 2048 MB: {verdict}; "
          f"load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
