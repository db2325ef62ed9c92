"""Fingerprint of simulated outputs: proof that a refactor changed no behaviour.

Runs ``rlsched compare`` (the library function, not a subprocess) for every shipped policy
plus the staleness-1 variants on the shipped trace, in four settings (plain, with a fault
schedule, with the trajectory processor, both), and prints one SHA-256 per setting of
``summary.csv`` with the host-time columns removed, of every run's ``events.parquet`` and
``intervals.parquet`` contents, and one of everything together.

Usage: ``python bench/fingerprint.py [--json OUT]``. Run it before and after a change that
must not alter behaviour; the ``all`` line must be equal. Host-time columns (``wall_seconds``
and any other in ``HOST_COLUMNS``) differ between any two runs and are excluded; so are the
report files, which embed nothing the run records do not.

Every setting runs the default cost model (``default_cost()``: the ``DEFAULT_PRESET``, with
the trainer's memory floor). A fifth setting, ``no-spread``, replays a generated ``uniform``
trace (every trajectory one length, so a batch finishes in one instant) on 64 GPUs of tp 8
with elastic's and async's staleness-1 specs: the shipped trace never reaches the rules for
batches that finish at once (``settle``, a step trained whole, the held split), and a
refactor of those must be provable too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from pathlib import Path

import pandas as pd

from rlsched.cluster.config import RunConfig
from rlsched.cluster.faults import Fault, FaultSchedule
from rlsched.compare import ComparePlan, compare
from rlsched.policies import available
from rlsched.sim.presets import default_cost
from rlsched.traces import generate_trace, sample_trace_path, write_trace

HOST_COLUMNS = ("wall_seconds",)
FAULTS = FaultSchedule(
    (Fault("gpu", per_hour=6.0), Fault("tool", per_hour=60.0), Fault("trainer", per_hour=3.0),
     Fault("sync", per_hour=6.0)),
    seed=3,
)


def specs() -> tuple[str, ...]:
    return (*available(), "async:rollout_fraction=0.5,staleness=1", "elastic:staleness=1")


def _frame_digest(df: pd.DataFrame) -> str:
    return hashlib.sha256(df.to_json(double_precision=15, orient="split").encode()).hexdigest()


NO_SPREAD_SPECS = ("colocated", "elastic", "elastic:staleness=1", "elastic:staleness=1,train_share=0.5",
                   "async:rollout_fraction=0.5,staleness=1")


def _digest_runs(plan: ComparePlan, out: Path) -> str:
    """SHA-256 of ``plan``'s summary (host-time columns removed) and every run's events and
    intervals."""
    summary = compare(plan, out, report=False)
    summary = summary.drop(columns=[c for c in HOST_COLUMNS if c in summary.columns])
    h = hashlib.sha256(summary.to_csv(index=False).encode())
    for rd in sorted((out / "runs").iterdir()):
        for part in ("events", "intervals"):
            h.update(_frame_digest(pd.read_parquet(rd / f"{part}.parquet")).encode())
    return h.hexdigest()


def _no_spread() -> str:
    """The ``no-spread`` setting: a ``uniform`` trace, 3 steps of 6 tasks x 8 samples."""
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "uniform.parquet"
        write_trace(generate_trace("uniform", seed=388521, tasks=18, samples=8, turns_scale=0.3), trace)
        cfg = RunConfig(gpus=64, tp=8, steps=3, tasks_per_step=6, check=True)
        return _digest_runs(ComparePlan(trace, NO_SPREAD_SPECS, cfg, default_cost()), Path(d) / "out")


def fingerprint() -> dict[str, str]:
    out: dict[str, str] = {}
    for name, faults, processor in (("plain", None, False), ("faults", FAULTS, False),
                                    ("processor", None, True), ("faults+processor", FAULTS, True)):
        cfg = RunConfig(gpus=16, tp=2, steps=4, tasks_per_step=8, check=True,
                        faults=faults, processor=processor)
        with tempfile.TemporaryDirectory() as d:
            out[name] = _digest_runs(ComparePlan(sample_trace_path(), specs(), cfg, default_cost()), Path(d) / "out")
    out["no-spread"] = _no_spread()
    out["all"] = hashlib.sha256("".join(out[k] for k in sorted(out)).encode()).hexdigest()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="also write the digests to this file")
    args = ap.parse_args()
    fp = fingerprint()
    for k, v in fp.items():
        print(f"{k:18s} {v}")
    if args.json:
        args.json.write_text(json.dumps(fp, indent=1) + "\n")


if __name__ == "__main__":
    main()
