"""When does elastic scheduling pay? A map over the reference-like regime (issue 24).

Long-tail agent traces (the ``longtail-small`` generator with tokens x3 and contexts up to
1M tokens, so the tail reaches the reference's ~700k-token rollouts), models from 32B dense
to the ~2.4T MoE preset, clusters of 256-4096 GPUs, the trainer sized for 700k-token
sequences (its memory floor binds). Per point: elastic (staleness 1) over colocated and
over the best async (staleness 1, rollout_fraction 0.5 or 0.75), against the training
share of GPU-time (colocated's train / (train + generate) GPU-seconds) and the tail's
weight (share of trajectories from the long component). Prints a table and writes a PNG:

    python bench/regime_map.py --out regime_map.png            # the full sweep
    python bench/regime_map.py --quick --out /tmp/map.png      # one model, one size
    python bench/regime_map.py --model ref-2.4t --gpus 1024 --seq 0 --out /tmp/nofloor.png
        # one point set without the trainer-memory model (no floor, free resharding,
        # perfect scaling; topology and MoE decode stay): what the floor did
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor

from rlsched.cluster.config import RunConfig
from rlsched.policies import make_policy
from rlsched.sim.memory import min_engine_gpus, train_layout
from rlsched.sim.presets import preset_cost, with_seq
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload
from rlsched.traces import draw_batches, generate_trace

SEQ = 700_000.0
TAILS = (0.05, 0.15, 0.35)
POLICIES = ("colocated", "elastic:staleness=1", "async:rollout_fraction=0.5,staleness=1",
            "async:rollout_fraction=0.75,staleness=1")
FULL = (("qwen2.5-32b", "h200", (256, 1024)), ("ref-2.4t", "h200", (1024, 4096)))
QUICK = (("qwen2.5-32b", "h200", (256,)),)
STEPS = 3


def run_point(args: tuple[str, str, int, float, str, float]) -> dict:
    model, gpu, gpus, tail, spec, seq = args
    cost = with_seq(preset_cost(model, gpu), seq)
    tp = max(4, min_engine_gpus(cost))
    tasks = max(8, gpus // 32)
    df = generate_trace("longtail-small", seed=0, tasks=tasks * STEPS, long_frac=tail, tokens_scale=3.0,
                        max_context_tokens=1_000_000)
    w, b = Workload.from_frame(df), draw_batches(df, STEPS, tasks)
    t0 = time.perf_counter()
    try:
        out = simulate(w, b, make_policy(spec), RunConfig(gpus=gpus, tp=tp, steps=STEPS), cost)
    except Exception as exc:  # a policy that cannot run here (e.g. a split below the floor)
        return {"model": model, "gpus": gpus, "tail": tail, "spec": spec, "error": str(exc).splitlines()[0]}
    r = out.result
    train = r.gpu_seconds.get("train", 0.0)
    gen = r.gpu_seconds.get("generate", 0.0)
    return {"model": model, "gpus": gpus, "tail": tail, "spec": spec, "seconds": r.makespan,
            "train_share": train / (train + gen) if train + gen else 0.0, "tp": tp,
            "floor": train_layout(cost).min_gpus, "wall": time.perf_counter() - t0, "error": ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="regime_map.png")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--model", help="one model preset instead of the grid's")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--gpus", type=int, nargs="*", help="cluster sizes (with --model)")
    ap.add_argument("--seq", type=float, default=SEQ, help="trained sequence length; 0: no trainer-memory model")
    a = ap.parse_args()
    t0 = time.time()
    grid = QUICK if a.quick else FULL
    if a.model:
        grid = ((a.model, a.gpu, tuple(a.gpus or (1024,))),)
    jobs = [(m, g, n, tail, s, a.seq) for m, g, sizes in grid for n in sizes for tail in TAILS for s in POLICIES]
    with ProcessPoolExecutor(a.workers) as pool:
        rows = list(pool.map(run_point, jobs))
    by: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        by.setdefault((r["model"], r["gpus"], r["tail"]), {})[r["spec"]] = r
    print("| model | GPUs | engine tp | trainer floor | tail weight | train share (colocated) | "
          "colocated s | elastic k=1 s | best async k=1 s | elastic/colocated | elastic/best async | best async |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    points = []
    for (model, gpus, tail), rs in by.items():
        col, el = rs["colocated"], rs["elastic:staleness=1"]
        asy = [r for s, r in rs.items() if s.startswith("async") and not r["error"]]
        if col["error"] or el["error"] or not asy:
            errs = "; ".join(f"{s}: {r['error']}" for s, r in rs.items() if r["error"])
            print(f"| {model} | {gpus} | | | {tail} | | | | | | | failed: {errs} |")
            continue
        best = min(asy, key=lambda r: r["seconds"])
        vs_col, vs_async = col["seconds"] / el["seconds"], best["seconds"] / el["seconds"]
        points.append((model, gpus, tail, col["train_share"], vs_col, vs_async))
        print(f"| {model} | {gpus} | {col['tp']} | {col['floor']} | {tail:g} | {col['train_share']:.2f} | "
              f"{col['seconds']:.0f} | {el['seconds']:.0f} | {best['seconds']:.0f} | {vs_col:.2f}x | {vs_async:.2f}x | {best['spec'].split(':')[1]} |")
    plot(points, a.out)
    print(f"\nwrote {a.out}; bench wall time {time.time() - t0:.0f} s")


def plot(points: list[tuple], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    marks = {"qwen2.5-32b": "o", "ref-2.4t": "s"}
    for ax, k, title in ((axes[0], 4, "elastic (k=1) / colocated"), (axes[1], 5, "elastic (k=1) / best async (k=1)")):
        for model, gpus, tail, share, *ratios in points:
            sc = ax.scatter(share, ratios[k - 4], c=[tail], cmap="viridis", vmin=0, vmax=max(TAILS),
                            marker=marks.get(model, "^"), s=30 + gpus / 40, edgecolors="k")
            ax.annotate(f"{gpus}", (share, ratios[k - 4]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("training share of GPU-time (colocated)")
        ax.set_title(title)
    axes[0].set_ylabel("speed-up (makespan ratio)")
    for model, m in marks.items():
        axes[1].scatter([], [], marker=m, c="w", edgecolors="k", label=model)
    axes[1].legend(loc="best", fontsize=8)
    fig.colorbar(sc, ax=axes, label="tail weight (long-component share)")
    fig.savefig(path, dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    main()
