"""Issue 23 bench: does elastic reach its bound, and never lose to a baseline?

One command. For each trace and cluster size, every policy replays the same tasks on the
same (default) cost model with the same trajectory-processor setting, for ``--steps``
steps (>= 12: 4-step runs are dominated by the first batch's warm-up):

* baselines with their own best parameters: colocated (staleness 0); async swept over
  ``rollout_fraction`` 0.25..0.75 at staleness 0 and 1; partial (resume: staleness 1)
  swept over ``finish_fraction``;
* elastic at staleness 0 and 1 (defaults: what a user who reads nothing else gets);
* ``oracle`` (elastic placing by the trace's true lengths): a reference only -- it sees the
  future, yet it is no upper bound of the heuristic (slower than elastic at all six default
  points; faster on the three real-log traces of the README at staleness 1);
* an ablation of elastic: length prediction off (``order=fifo``), late binding off
  (``pack=64``: a batch is bound to engines at once), packing the tail off
  (``kv_limit=0.01``: only emptied engines leave rollout), tail stealing off (``steal=false``:
  an idle engine does not Move the longest trajectory off a crowded one), and tail cutting
  on at staleness 1 (``cut=0.25``: the step's last quarter at most is trained with the next
  step, running on, or with ``cut_stop`` interrupted keeping progress and resumed; batches
  are then released one version later), and the trainer's sizing at staleness 1: no
  trainer reserved (``train_share=0``: it forms from freed engines) and kept to train its
  backlog within 0.4 of a rollout (``train_within=0.4``), with and without the empty
  trainer's hedge (``hedge=false``); and tail isolation off at staleness 1
  (``isolate=false``: a step's tail stays on the engines it runs on); and, at staleness 1,
  no fixed split held when moves cannot pay (``hold=false``), micro-batches that never
  wait for GPUs on their way to the trainer (``join=false``) and queued work that stays on
  the KV-full engine it was placed on (``rebalance=false``).

Traces: the shipped long-tail sample, the seed-scale preset (``swe-seed``, turns scaled
by ``--seed-turns-scale`` to fit the time) and the drift preset (``longtail-growing``);
16 tasks x 8 samples per step per 64 GPUs. Prints markdown: one table per (trace, GPUs)
with ratios against colocated and against the best baseline at the same staleness, the
gap to each policy's own lower bound, that gap split by cause (``summary.csv``'s
``gap_*`` columns: the GPU-time each cause lost, attributed so that the causes sum
exactly to the gap) with the bound term that binds, then a summary. Run:

    python bench/bench_elastic.py                      # 64, 256, 1024 GPUs (long)
    python bench/bench_elastic.py --gpus 64 --traces longtail

A trace of one's own -- say one imported from real agent logs with ``rlsched trace import``
-- is benched with ``--trace-file PATH`` (repeatable; its label is the file's stem), alone
with ``--traces none``. Such a trace keeps its own trajectories per task (a log of one run
per task has 1, not 8), so its step takes as many tasks as give the bench's own
trajectories per step (2 x GPUs: 16 tasks x 8 samples per 64 GPUs), or every task of the
trace when it has fewer; the table's header says which:

    rlsched trace import --format mini-swe-agent runs/ --out real.parquet
    python bench/bench_elastic.py --gpus 64 --traces none --trace-file real.parquet
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rlsched.analysis.metrics import GAP_CAUSES, summarize
from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import RlschedError
from rlsched.cluster.ids import TrajStatus
from rlsched.cluster.record import read_run
from rlsched.policies import make_policy, parse_spec
from rlsched.policies.oracle import Oracle
from rlsched.policies.registry import resolve_params
from rlsched.sim.presets import default_cost
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload
from rlsched.traces import draw_batches, generate_trace, load_trace, sample_trace_path, write_trace

FRACTIONS = (0.25, 0.375, 0.5, 0.625, 0.75)
BASELINES = (["colocated"]
             + [f"async:rollout_fraction={f},staleness={k}" for k in (0, 1) for f in FRACTIONS]
             + [f"partial:finish_fraction={f}" for f in (0.5, 0.75, 0.9)])
ELASTIC = ["elastic", "elastic:staleness=1", "oracle", "oracle:staleness=1"]
ABLATION = ([f"elastic:{a}{',staleness=1' if k else ''}" for k in (0, 1)
             for a in ("order=fifo", "pack=64", "kv_limit=0.01", "steal=false")]
            + [f"elastic:cut=0.25{stop},staleness=1" for stop in ("", ",cut_stop=true")]
            + ["elastic:isolate=false,staleness=1", "elastic:hold=false,staleness=1",
               "elastic:join=false,staleness=1", "elastic:rebalance=false,staleness=1",
               "elastic:train_share=0,train_within=0.4,staleness=1",
               "elastic:train_share=0,train_within=0.4,hedge=false,staleness=1"])
CAUSES = (*GAP_CAUSES, "gap_other_s")
CAUSE_NAMES = {"gap_tail_s": "tail", "gap_trainer_wait_s": "trainer waiting", "gap_switch_s": "switching",
               "gap_sync_s": "sync", "gap_other_s": "other"}
# what holds each step back (rlsched.analysis.critical; summary.csv's sums over the steps)
HELD = ("steps_longest_solo_s", "steps_start_delay_s", "steps_tail_slowdown_s", "steps_after_rollout_s")
HELD_NAMES = {"steps_longest_solo_s": "longest solo", "steps_start_delay_s": "start delay",
              "steps_tail_slowdown_s": "tail slowdown", "steps_after_rollout_s": "after rollout"}
_CACHE: dict[tuple, tuple] = {}


def _setup(trace: str, steps: int, tasks: int):
    key = (trace, steps, tasks)
    if key not in _CACHE:
        df = load_trace(trace)
        w = Workload.from_frame(df)
        b = draw_batches(df, steps, tasks)
        turns = {rid: int(w.turns[w.index[tid]]) for batch in b for rid, tid in batch}
        _CACHE[key] = (w, b, turns)
    return _CACHE[key]


def _policy(spec: str, turns: dict[str, int]):
    if spec.startswith("oracle"):
        _, raw = parse_spec(spec)
        return Oracle.from_lengths(turns, **resolve_params(Oracle, raw))
    return make_policy(spec)


def run_one(job: tuple[str, str, int, int, int, bool]) -> dict:
    trace, spec, gpus, steps, tasks, processor = job
    w, b, turns = _setup(trace, steps, tasks)
    policy = _policy(spec, turns)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:  # (the record, for the gap by cause)
        out = simulate(w, b, policy, RunConfig(gpus=gpus, tp=4, steps=steps, processor=processor),
                       default_cost(), out_dir=Path(d) / "run")
        row = summarize(read_run(Path(d) / "run"))
    r = out.result
    # staleness of trained tokens, as compare counts it (a trajectory with no kept token
    # has none)
    stale = max((t.trained_version - t.min_version for t in r.state.trajs.values()
                 if t.status is TrajStatus.TRAINED and t.min_version >= 0), default=0)
    return {"spec": spec, "k": policy.max_staleness, "seconds": r.makespan, "complete": r.complete,
            "bound": out.lower_bound_seconds, "tokens": sum(s["trained_tokens"] for s in r.steps),
            "stale": stale, "wall": time.perf_counter() - t0,
            "binds": max(out.bound_terms, key=out.bound_terms.__getitem__),
            **{c: row[c] for c in ("gap_seconds", *CAUSES, *HELD)}}


def trace_file_step(path: str, gpus: int) -> tuple[int, int, str]:
    """Tasks per step for a trace file, its trajectories per task, and the header's note.

    The bench's own traces give every step ``2 * gpus`` trajectories (16 tasks x 8 samples
    per 64 GPUs). A trace file keeps its own trajectories per task, so its step takes enough
    tasks for the same number of trajectories (at the trace's mean per task) -- or, when the
    trace has fewer tasks than that (per ``step`` value, for a trace that records RL steps),
    all of them, and the note says so. The samples returned (for the header) are the median.
    """
    df = load_trace(path)
    first = df.drop_duplicates("trajectory_id")
    per_task = first.groupby("task_id").size()
    samples = max(1, round(float(per_task.median())))
    mean = float(per_task.mean())
    if "step" in first.columns:
        have = int(first.groupby("step")["task_id"].nunique().max())
    else:
        have = int(first["task_id"].nunique())
    want = max(1, math.ceil(2 * gpus / mean))
    tasks = min(want, have)
    own = (f"the bench's own traces: {2 * gpus} trajectories per step (16 tasks x 8 samples per "
           f"64 GPUs); this trace has {have} tasks, {len(first)} trajectories ({samples} per task, "
           f"median)")
    if tasks == want:
        return tasks, samples, f"{own}, so {tasks} tasks per step match them (~{round(tasks * mean)} trajectories)"
    return tasks, samples, (f"{own}, so each step takes all {have} tasks (~{round(have * mean)} trajectories; "
                            f"{want} tasks would match)")


def study(pool: ProcessPoolExecutor, trace: str, label: str, gpus: int, steps: int,
          processor: bool, per_step: tuple[int, int, str] | None = None) -> dict:
    """One (trace, GPUs) table. ``per_step``: (tasks, samples, note) for a trace file;
    ``None`` for the bench's own traces (16 tasks x 8 samples per 64 GPUs)."""
    tasks = 16 * gpus // 64 if per_step is None else per_step[0]
    specs = BASELINES + ELASTIC + ABLATION
    rows = {r["spec"]: r for r in pool.map(run_one, [(trace, s, gpus, steps, tasks, processor) for s in specs])}
    col = rows["colocated"]
    best: dict[int, dict] = {}
    for k in (0, 1):
        cands = [r for s, r in rows.items() if s in BASELINES and r["k"] == k and r["complete"]]
        best[k] = min(cands, key=lambda r: r["seconds"])
    ref_tokens = col["tokens"]
    samples = 8 if per_step is None else per_step[1]
    print(f"\n### {label}: {gpus} GPUs, {steps} steps, {tasks} tasks x {samples} samples per step"
          f" (processor {'on' if processor else 'off'})\n")
    if per_step is not None:
        print(f"trace file {trace}: {per_step[2]}\n")
    print("| policy | k | sim s | steps/h | bound s | gap to bound | vs colocated | vs best baseline same k | tokens vs colocated | max stale |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    shown = [best[0]["spec"], best[1]["spec"], *ELASTIC, *ABLATION]
    for s in dict.fromkeys(["colocated", *shown]):
        r = rows[s]
        k = min(r["k"], 1)
        tag = f" (best k={k} baseline)" if s in (best[0]["spec"], best[1]["spec"]) else ""
        tag += " (reference: true lengths)" if s.startswith("oracle") else ""
        print(f"| {s}{tag} | {r['k']} | {r['seconds']:.0f} | {3600 * steps / r['seconds']:.3f} | "
              f"{r['bound']:.0f} | {100 * (r['seconds'] / r['bound'] - 1):.1f}% | "
              f"{col['seconds'] / r['seconds']:.3f}x | {best[k]['seconds'] / r['seconds']:.3f}x | "
              f"{100 * (r['tokens'] / ref_tokens - 1):+.2f}% | {r['stale']} |")
    print("\nGap to the bound by cause (seconds, and share of the gap; the causes sum to the gap):\n")
    print("| policy | k | bound term | gap s | " + " | ".join(CAUSE_NAMES[c] for c in CAUSES) + " |")
    print("|---|---:|---|---:|" + "---:|" * len(CAUSES))
    for s in dict.fromkeys(["colocated", *shown]):
        r = rows[s]
        g = r["gap_seconds"]
        cells = " | ".join(f"{r[c]:.0f} ({100 * r[c] / g:.0f}%)" if g > 0 else f"{r[c]:.0f}" for c in CAUSES)
        print(f"| {s} | {r['k']} | {r['binds']} | {g:.0f} | {cells} |")
    off = [s for s, r in rows.items() if abs(r["tokens"] - ref_tokens) > 0.01 * ref_tokens]
    bad = [s for s, r in rows.items() if r["stale"] > r["k"] or not r["complete"]]
    print(f"\ntrained tokens within 1% of colocated: {'all' if not off else 'NOT ' + ', '.join(off)}; "
          f"staleness within each policy's bound and every run complete: {'yes' if not bad else 'NO: ' + ', '.join(bad)}")
    print("async sweep (s): " + ", ".join(f"{s.split(':')[1]}={rows[s]['seconds']:.0f}" for s in BASELINES if s.startswith("async")))
    el0, el1 = rows["elastic"], rows["elastic:staleness=1"]
    return {"label": label, "gpus": gpus,
            "k0_vs_col": col["seconds"] / el0["seconds"], "k0_bound_allows": col["seconds"] / el0["bound"],
            "k0_gap": el0["seconds"] / el0["bound"] - 1,
            "k1_vs_best": best[1]["seconds"] / el1["seconds"], "k1_bound_allows": best[1]["seconds"] / el1["bound"],
            "k1_gap": el1["seconds"] / el1["bound"] - 1, "best1": best[1]["spec"],
            "oracle1_vs_best": best[1]["seconds"] / rows["oracle:staleness=1"]["seconds"],
            "k1_gap_by_cause": {c: el1[c] for c in CAUSES}, "k1_gap_s": el1["gap_seconds"],
            "k0_gap_by_cause": {c: el0[c] for c in CAUSES}, "k0_gap_s": el0["gap_seconds"],
            "held": {k: {c: r[c] for c in HELD} for k, r in ((0, el0), (1, el1))},
            "col_held": {c: col[c] for c in HELD},
            "wall": sum(r["wall"] for r in rows.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", default="64,256,1024", help="cluster sizes, comma-separated")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--traces", default="longtail,seed,growing",
                    help="any of longtail, seed, growing; 'none' (or '') for only --trace-file")
    ap.add_argument("--trace-file", action="append", default=[], metavar="PATH",
                    help="also bench this trace file (e.g. from `rlsched trace import`); repeatable; "
                         "labelled by its file stem")
    ap.add_argument("--seed-turns-scale", type=float, default=0.25,
                    help="turns of the swe-seed preset are scaled by this to fit the time")
    ap.add_argument("--processor", action="store_true", help="train through the trajectory processor (all policies)")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    if a.steps < 12:
        ap.error("--steps must be >= 12 (shorter runs measure the first batch's warm-up)")
    t0 = time.time()
    sizes = [int(g) for g in a.gpus.split(",")]
    summary: list[dict] = []
    names = [n for n in a.traces.split(",") if n not in ("", "none")]
    if not names and not a.trace_file:
        ap.error("--traces none: give at least one --trace-file")
    per_step: dict[tuple[str, int], tuple[int, int, str]] = {}
    for path in a.trace_file:  # every file read (and refused) before the first run
        try:
            for gpus in sizes:
                per_step[path, gpus] = trace_file_step(path, gpus)
        except RlschedError as e:
            ap.error(f"--trace-file {path}: {e}")
    with tempfile.TemporaryDirectory() as d, ProcessPoolExecutor(a.workers) as pool:
        for name in names:
            for gpus in sizes:
                tasks = a.steps * 16 * gpus // 64
                if name == "longtail":
                    path, label = str(sample_trace_path()), "longtail-small (shipped; its 64 tasks repeat)"
                elif name == "seed":
                    path = str(Path(d) / f"seed-{gpus}.parquet")
                    write_trace(generate_trace("swe-seed", seed=0, tasks=tasks, turns_scale=a.seed_turns_scale), path)
                    label = f"swe-seed (turns x{a.seed_turns_scale:g})"
                elif name == "growing":
                    path = str(Path(d) / f"growing-{gpus}.parquet")
                    write_trace(generate_trace("longtail-growing", seed=0, tasks=tasks), path)
                    label = "longtail-growing (episodes grow over the run)"
                else:
                    ap.error(f"--traces: unknown trace {name!r}")
                summary.append(study(pool, path, label, gpus, a.steps, a.processor))
        for path in a.trace_file:
            for gpus in sizes:
                summary.append(study(pool, path, Path(path).stem, gpus, a.steps, a.processor,
                                     per_step=per_step[path, gpus]))
    print("\n### Summary (elastic defaults; ratios are speed-ups in steps/hour)\n")
    print("| trace | GPUs | k=0: elastic / colocated | k=0: bound allows | k=0 gap to bound | "
          "k=1: elastic / best baseline | k=1: bound allows | k=1 gap to bound | oracle k=1 / best | best k=1 baseline |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for s in summary:
        print(f"| {s['label']} | {s['gpus']} | {s['k0_vs_col']:.3f}x | {s['k0_bound_allows']:.3f}x | "
              f"{100 * s['k0_gap']:.1f}% | {s['k1_vs_best']:.3f}x | {s['k1_bound_allows']:.3f}x | "
              f"{100 * s['k1_gap']:.1f}% | {s['oracle1_vs_best']:.3f}x | {s['best1']} |")
    print("\n### The elastic defaults' gap to the bound by cause (seconds; share of the gap)\n")
    print("| trace | GPUs | k | gap s | " + " | ".join(CAUSE_NAMES[c] for c in CAUSES) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(CAUSES))
    for s in summary:
        for k in (0, 1):
            g, by = s[f"k{k}_gap_s"], s[f"k{k}_gap_by_cause"]
            cells = " | ".join(f"{by[c]:.0f} ({100 * by[c] / g:.0f}%)" if g > 0 else f"{by[c]:.0f}" for c in CAUSES)
            print(f"| {s['label']} | {s['gpus']} | {k} | {g:.0f} | {cells} |")
    print("\n### What holds each step back (seconds summed over the steps; share of the time beyond "
          "their longest solo; at staleness k each step's link spans k+1 steps)\n")
    print("| trace | GPUs | policy | " + " | ".join(HELD_NAMES[c] for c in HELD) + " |")
    print("|---|---:|---|" + "---:|" * len(HELD))
    for s in summary:
        for name, held in (("colocated", s["col_held"]), ("elastic", s["held"][0]),
                           ("elastic:staleness=1", s["held"][1])):
            over = sum(held[c] for c in HELD[1:])
            cells = [f"{held[HELD[0]]:.0f}"] + [f"{held[c]:.0f} ({100 * held[c] / over:.0f}%)" if over > 0
                                                else f"{held[c]:.0f}" for c in HELD[1:]]
            print(f"| {s['label']} | {s['gpus']} | {name} | " + " | ".join(cells) + " |")
    print(f"\nbench wall time: {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
