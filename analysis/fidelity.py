"""Simulator fidelity: compare a live run with its replay in the simulator.

The replay itself (same policy, same steps, a given cost model) is made by
:mod:`rlsched.fidelity`, which joins the simulator and this module; here two run records
are compared step by step (wall time of each optimizer step), in GPU-time per state, and
in the *order* of role changes and weight syncs (a policy that reacts to timing may take
a different path in the simulator -- that is a fidelity finding in itself).

A second live run of the same config (``repeat``) gives the live run's own noise: the
per-step spread between the two runs. A simulator error below that spread is as good as
a single replay can be.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rlsched.cluster.errors import RecordError
from rlsched.cluster.record import RunRecord, read_run

from .load import check_step_rows
from .metrics import state_seconds, step_times

ORDER_KINDS = ("RolesChanged", "WeightsSynced", "TrainStepFinished")


@dataclass(frozen=True)
class FidelityResult:
    live: RunRecord
    sim: RunRecord
    steps: pd.DataFrame  # step, live_seconds, sim_seconds, abs_error_pct[, repeat_seconds, spread_pct]
    states: pd.DataFrame  # state, live_gpu_seconds, sim_gpu_seconds, ...
    live_order: list[str]
    sim_order: list[str]
    summary: dict[str, Any]
    repeat: RunRecord | None = None


def live_record(path: Path) -> RunRecord:
    """Read ``path`` as a live run with a recorded trace and at least one finished step."""
    rec = repeat_record(path)
    if rec.meta.get("driver") != "live":
        raise RecordError(f"{path}: meta.driver is {rec.meta.get('driver')!r}; fidelity needs a live run (rlsched run --live)")
    if rec.steps.empty:
        raise RecordError(f"{path}: the live run finished no optimizer step; nothing to compare")
    trace = rec.meta.get("trace")
    if not trace or not (rec.path / str(trace)).is_file():
        raise RecordError(f"{path}: no recorded trace (meta.trace -> trace.parquet); re-run it with this rlsched")
    return rec


def repeat_record(path: Path) -> RunRecord:
    """Read ``path`` with its steps table checked as the report checks it: a step time
    that went backwards was a negative live_seconds and a negative abs_error_pct in
    fidelity.csv, exit code 0."""
    rec = read_run(path)
    check_step_rows(rec.steps, rec.path / "steps.parquet")
    return rec


def step_table(live: RunRecord, sim: RunRecord, repeat: RunRecord | None = None) -> pd.DataFrame:
    lt = step_times(live).set_index("step")["seconds"]
    st = step_times(sim).set_index("step")["seconds"]
    steps = sorted(set(lt.index) & set(st.index))
    df = pd.DataFrame({"step": steps, "live_seconds": lt.loc[steps].to_numpy(),
                       "sim_seconds": st.loc[steps].to_numpy()})
    df["abs_error_pct"] = 100.0 * (df["sim_seconds"] - df["live_seconds"]).abs() / df["live_seconds"]
    df["signed_error_pct"] = 100.0 * (df["sim_seconds"] - df["live_seconds"]) / df["live_seconds"]
    if repeat is not None:
        rt = step_times(repeat).set_index("step")["seconds"]
        df["repeat_seconds"] = [float(rt.get(s, np.nan)) for s in steps]
        mean = (df["live_seconds"] + df["repeat_seconds"]) / 2
        df["spread_pct"] = 100.0 * (df["live_seconds"] - df["repeat_seconds"]).abs() / mean
    return df


def state_table(live: RunRecord, sim: RunRecord) -> pd.DataFrame:
    lv, sv = state_seconds(live), state_seconds(sim)
    df = pd.DataFrame({"state": lv.index, "live_gpu_seconds": lv.to_numpy(),
                       "sim_gpu_seconds": sv.reindex(lv.index).fillna(0.0).to_numpy()})
    lt, stt = df["live_gpu_seconds"].sum(), df["sim_gpu_seconds"].sum()
    df["live_share"] = df["live_gpu_seconds"] / lt if lt > 0 else 0.0
    df["sim_share"] = df["sim_gpu_seconds"] / stt if stt > 0 else 0.0
    return df


def event_order(rec: RunRecord) -> list[str]:
    """Role changes, weight syncs and step ends in time order, as comparable labels."""
    ev = rec.events
    ev = ev[ev["kind"].isin(ORDER_KINDS)].sort_values("time", kind="stable")
    out = []
    for kind, detail, version in zip(ev["kind"], ev["detail"], ev["version"], strict=True):
        if kind == "RolesChanged":
            out.append(f"roles:{str(detail).split(' ')[0]}")
        elif kind == "WeightsSynced":
            out.append(f"sync:v{int(version)}")
        else:
            out.append(f"step:v{int(version)}")
    return out


def check_repeat(live: RunRecord, repeat: RunRecord) -> None:
    """``--repeat`` must be another live run of the same policy: the live run itself gave a
    "live spread" of 0.0%, and a simulated run one between a simulation and the live run,
    both printed and written as the run-to-run spread, exit code 0."""
    if repeat.path.resolve() == live.path.resolve():
        raise RecordError(f"--repeat {repeat.path}: is the live run itself; expected a second live "
                          "run of the same config (its run-to-run spread)")
    if repeat.meta.get("driver") != "live":
        raise RecordError(f"--repeat {repeat.path}: meta.driver is {repeat.meta.get('driver')!r}; expected "
                          "a second live run of the same config (rlsched run --live)")
    if repeat.meta.get("policy") != live.meta.get("policy"):
        raise RecordError(f"--repeat {repeat.path}: policy {repeat.meta.get('policy')!r} differs from "
                          f"the live run's {live.meta.get('policy')!r}")


def compare_runs(live: RunRecord, sim: RunRecord, repeat: RunRecord | None = None) -> FidelityResult:
    """Per step, per GPU state and in event order: the live run against its replay."""
    if repeat is not None:
        check_repeat(live, repeat)
    steps = step_table(live, sim, repeat)
    states = state_table(live, sim)
    lo, so = event_order(live), event_order(sim)
    err = steps["abs_error_pct"].to_numpy()
    summary: dict[str, Any] = {
        "policy": str(live.meta["policy"]), "steps": len(steps),
        "median_abs_error_pct": float(np.median(err)), "max_abs_error_pct": float(err.max()),
        "p90_abs_error_pct": float(np.percentile(err, 90)),
        "live_total_seconds": float(live.steps["time"].max()),
        "sim_total_seconds": float(sim.steps["time"].max()),
        "order_identical": lo == so, "order_first_difference": _first_difference(lo, so),
        "spread_median_pct": float(steps["spread_pct"].median()) if "spread_pct" in steps else None,
        "trajectory_seconds_live": _median_duration(live), "trajectory_seconds_sim": _median_duration(sim),
        "live_run": str(live.path), "repeat_run": str(repeat.path) if repeat is not None else None,
    }
    return FidelityResult(live, sim, steps, states, lo, so, summary, repeat)


def write_tables(result: FidelityResult, out: Path) -> None:
    """``fidelity.csv``, ``fidelity_states.csv`` and ``fidelity_summary.json``."""
    result.steps.to_csv(out / "fidelity.csv", index=False)
    result.states.to_csv(out / "fidelity_states.csv", index=False)
    (out / "fidelity_summary.json").write_text(json.dumps(result.summary, indent=2) + "\n")


def _median_duration(rec: RunRecord) -> float:
    """Median dispatch-to-finish seconds of a trajectory: the rollout side of a step,
    without the role switches around it."""
    t = rec.trajectories
    d = (t["finish_time"] - t["dispatch_time"]).dropna()
    return float(d.median()) if len(d) else float("nan")


def _first_difference(a: list[str], b: list[str]) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"#{i}: live {x} vs sim {y}"
    if len(a) != len(b):
        return f"#{min(len(a), len(b))}: live has {len(a)} entries, sim {len(b)}"
    return ""
