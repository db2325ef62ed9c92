"""The training-equivalence experiment, live, as one command: do the scheduling policies
train as well as the colocated baseline at equal steps?

    python bench/learn_equivalence.py --out out/equiv              # 4 policies x 3 seeds x 40 steps
    python bench/learn_equivalence.py --out out/equiv --steps 6 --seeds 0   # a quick look

For every seed and policy (colocated, elastic k=0, elastic k=1, async k=1 by default) it
runs ``rlsched run --live`` on the same config (``configs/live-learn.toml``: the same
tasks, drawn in the same order for a seed, from the same warm-started checkpoint), then
prints and writes (``OUT/rewards.csv``, ``OUT/summary.csv``):

* reward by step, one column per policy and seed (the learning curves);
* per policy: first- and last-5-step mean reward over seeds, their spread (min..max over
  seeds), wall time, generated tokens per second;
* the equality check for staleness 0: per step, elastic k=0 must train the same
  (trajectory, version) set as colocated, and its token-mean loss over the step must equal
  colocated's within ``--loss-rtol`` (the same tokens through the same weights; the
  engines' batching may make sampled tokens differ on some hosts -- then the set check
  still holds and the loss line says how far apart they are).

A run directory that already holds a complete run is reused (``--rerun`` to redo it), so
an interrupted experiment continues where it stopped -- and it can be run one seed or one
policy at a time (``--seeds 1 --policies async-k1``), each call under its own lock, then
summarised with ``--existing`` (tables of the complete runs found, the missing ones named,
nothing run).

``async-k0`` (``--policies ...,async-k0``; not in the default grid) is an on-policy run on a
fixed split: it trains the same (trajectory, version) sets as colocated without colocated's
engine and trainer restarts every step, so it measures on-policy learning over several
seeds cheaply; elastic k=0 is checked against it as against colocated. ``partial``
(its defaults) is there too, so every shipped policy can be run the same way.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from rlsched.cluster.record import single_run_dir

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_curve import step_rewards

POLICIES = {
    "colocated": "colocated",
    "elastic-k0": "elastic:staleness=0",
    "elastic-k1": "elastic:staleness=1",
    "async-k1": "async:staleness=1",
    # on-policy on a fixed split: the same (trajectory, version) sets as colocated at a
    # fraction of its cost (no engine/trainer restart per step); not in the default grid
    "async-k0": "async:staleness=0",
    # partial rollout with its defaults (staleness 1: a cut trajectory resumes on the next
    # weights); not in the default grid -- with it, every shipped policy has a name here
    "partial": "partial",
}
DEFAULT = ("colocated", "elastic-k0", "elastic-k1", "async-k1")


def complete_run(out: Path, steps: int) -> dict | None:
    """The meta of a complete ``steps``-step run in ``out`` (``rlsched run``'s output folder
    or the run record itself), else None."""
    meta_path = single_run_dir(out) / "meta.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if meta.get("complete") and meta.get("steps_done") == steps:
            return meta
    return None


def run_one(spec: str, config: Path, steps: int, seed: int, out: Path, rerun: bool) -> dict:
    if not rerun and (meta := complete_run(out, steps)) is not None:
        return meta
    exe = Path(sys.executable).parent / "rlsched"  # the console script beside this interpreter
    cmd = [str(exe if exe.is_file() else "rlsched"), "run", "--policy", spec, "--live", "--config", str(config),
           "--steps", str(steps), "--seed", str(seed), "--out", str(out), "--force"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"{' '.join(cmd)}\nfailed after {time.perf_counter() - t0:.0f}s: {tail}")
    return json.loads((single_run_dir(out) / "meta.json").read_text())


def trained_sets(run: Path) -> dict[int, set[tuple[str, int]]]:
    tr = pd.read_parquet(single_run_dir(run) / "trajectories.parquet")
    out: dict[int, set[tuple[str, int]]] = {}
    for row in tr.itertuples():
        out.setdefault(int(row.step), set()).add((str(row.trajectory), int(row.trained_version)))
    return out


def step_losses(meta: dict) -> dict[int, float]:
    """Token-mean loss per step (micro-batches grouped by the version they trained at)."""
    num: dict[int, float] = {}
    den: dict[int, int] = {}
    for b in meta["measurements"]["micro_batches"]:
        if "version" not in b or not b.get("trained_tokens"):
            continue
        v = int(b["version"])
        num[v] = num.get(v, 0.0) + b["loss"] * b["trained_tokens"]
        den[v] = den.get(v, 0) + int(b["trained_tokens"])
    return {v: num[v] / den[v] for v in num}


def _k0_equal(out: Path, seed: int, ref: str, metas: dict[str, dict], rtol: float) -> list[str]:
    """Elastic k=0 against an on-policy reference run of the same seed: the same
    (trajectory, version) set at every step, per-step loss within ``rtol``."""
    failures = []
    a, b = trained_sets(out / f"{ref}-s{seed}"), trained_sets(out / f"elastic-k0-s{seed}")
    for step in sorted(set(a) | set(b)):
        if a.get(step) != b.get(step):
            failures.append(f"seed {seed} step {step}: elastic k=0 trained another (trajectory, version) set than {ref}")
    la, lb = step_losses(metas[ref]), step_losses(metas["elastic-k0"])
    worst = max((abs(la[v] - lb[v]) / max(abs(la[v]), 1e-12) for v in la if v in lb), default=0.0)
    line = f"seed {seed}: {ref} vs elastic k=0 per-step loss, worst relative difference {worst:.2e}"
    print(line)
    if worst > rtol:
        failures.append(line + f" > {rtol:g}")
    return failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--config", type=Path, default=Path(__file__).resolve().parents[1] / "configs" / "live-learn.toml")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--policies", default=",".join(DEFAULT), help=f"names from {', '.join(POLICIES)}")
    ap.add_argument("--loss-rtol", type=float, default=1e-4)
    ap.add_argument("--rerun", action="store_true")
    ap.add_argument("--existing", action="store_true",
                    help="run nothing: summarise the complete runs already in --out, name the missing ones")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    names = args.policies.split(",")
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        print(f"--policies: unknown {unknown[0]!r}; expected names from {', '.join(POLICIES)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    curves, summary, failures, missing = [], [], [], []
    for seed in seeds:
        metas: dict[str, dict] = {}
        for name in names:
            run = args.out / f"{name}-s{seed}"
            if args.existing:
                found = complete_run(run, args.steps)
                if found is None:
                    missing.append(f"{name}-s{seed}")
                    continue
                metas[name] = found
            else:
                print(f"seed {seed}: {name} ({POLICIES[name]}) -> {run}", flush=True)
                metas[name] = run_one(POLICIES[name], args.config, args.steps, seed, run, args.rerun)
            c = step_rewards(run)
            c["policy"], c["seed"] = name, seed
            curves.append(c)
            m = metas[name]
            first, last = c["reward"].head(5).mean(), c["reward"].tail(5).mean()
            # the bar ("from below 0.2 to above 0.8"): the last step of the first
            # 5-step window whose mean reward reaches 0.8 (empty if none does)
            rolling = c["reward"].rolling(5).mean()
            reached = c["step"][rolling >= 0.8]
            tokens = m["measurements"].get("tokens_generated", 0)
            summary.append({"policy": name, "seed": seed, "first5_reward": first, "last5_reward": last,
                            "wall_seconds": m["wall_seconds"], "tokens_per_second": tokens / max(m["makespan_seconds"], 1e-9),
                            "groups_varying_step0": float(c["groups_varying"].iloc[0]),
                            "mean5_reaches_0.8_at_step": int(reached.iloc[0]) if len(reached) else None})
        for ref in ("colocated", "async-k0"):  # the on-policy references elastic k=0 must equal
            if ref in metas and "elastic-k0" in metas:
                failures += _k0_equal(args.out, seed, ref, metas, args.loss_rtol)
    if not curves:
        print(f"no complete {args.steps}-step run in {args.out}", file=sys.stderr)
        return 2
    table = pd.concat(curves)
    wide = table.pivot_table(index="step", columns=["policy", "seed"], values="reward")
    wide.to_csv(args.out / "rewards.csv")
    sm = pd.DataFrame(summary)
    sm.to_csv(args.out / "summary.csv", index=False)
    agg = sm.groupby("policy", sort=False).agg(seeds=("seed", "size"), first5=("first5_reward", "mean"),
                                   last5=("last5_reward", "mean"),
                                   last5_min=("last5_reward", "min"), last5_max=("last5_reward", "max"),
                                   wall_s=("wall_seconds", "mean"), tok_s=("tokens_per_second", "mean"))
    with pd.option_context("display.width", 200, "display.max_rows", 200, "display.precision", 3):
        print("\nmean reward by step (columns: policy, seed)\n" + wide.to_string())
        print("\nper run\n" + sm.to_string(index=False))
        print("\nper policy over seeds (last5 spread: min..max over seeds)\n" + agg.to_string())
    if missing:
        print(f"\nnot run (no complete {args.steps}-step run): {', '.join(missing)}")
    for f in failures:
        print("NOT EQUIVALENT: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
