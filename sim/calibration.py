"""Fit the cost model's constants to calibration measurements (scipy least squares).

Pure: a table of measurements in, a :class:`~rlsched.sim.cost.CostModel` and a fit
quality per component out -- no Ray, vLLM or torch, so it is unit-tested on synthetic
measurements. Each component is fitted in the cost model's *own* formula (the one the
simulator evaluates), so the reported R² is the quality of what the simulator will
actually charge, not of a nicer curve it does not use. Where the formula cannot express
what was measured (for instance a fixed per-call overhead in a FLOP-proportional term),
that shows up as a low R² and is reported, not hidden.

Robust loss (``soft_l1``): the calibration host is shared, and a measurement that another
process stalled should not drag a constant; R² and the worst residual are computed on the
plain residuals of all measurements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from rlsched.cluster.errors import ConfigError

from .cost import CostModel


@dataclass(frozen=True)
class FitQuality:
    """How well one component's formula matches its measurements."""

    component: str
    n: int
    r2: float  # nan for a constant (one-value) model
    worst_residual_s: float  # largest |measured - predicted|
    worst_residual_pct: float  # the same, relative to that measurement
    median_residual_pct: float = float("nan")  # typical |residual| / measurement
    fitted: dict[str, float] = field(default_factory=dict)
    note: str = ""


Fitted = tuple[CostModel, FitQuality, np.ndarray, np.ndarray]  # cost, quality, measured, predicted


@dataclass(frozen=True)
class Calibration:
    cost: CostModel
    quality: tuple[FitQuality, ...]
    predictions: pd.DataFrame  # component, measured, predicted (for the fit plot)


def quality(component: str, y: np.ndarray, pred: np.ndarray, fitted: dict[str, float],
            note: str = "", constant: bool = False) -> FitQuality:
    res = y - pred
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = float("nan") if constant or ss_tot <= 0 else 1.0 - float((res**2).sum()) / ss_tot
    i = int(np.argmax(np.abs(res)))
    pct = 100.0 * abs(res[i]) / y[i] if y[i] > 0 else float("inf")
    rel = np.abs(res[y > 0]) / y[y > 0]
    med = 100.0 * float(np.median(rel)) if rel.size else float("nan")
    return FitQuality(component, len(y), r2, float(abs(res[i])), float(pct), med, fitted, note)


def _need(rows: pd.DataFrame, component: str, k: int = 1) -> pd.DataFrame:
    part = rows[rows["component"] == component]
    if len(part) < k:
        raise ConfigError(f"calibration: {len(part)} {component} measurements, need at least {k}")
    return part


def _solve(fun: Any, starts: list[list[float]], lo: list[float], hi: list[float], scale: float) -> np.ndarray:
    best = None
    for x0 in starts:
        r = least_squares(fun, x0, bounds=(lo, hi), loss="soft_l1", f_scale=scale, x_scale="jac")
        if best is None or r.cost < best.cost:
            best = r
    assert best is not None  # internal: starts is never empty
    return best.x


# --------------------------------------------------------------------- components
def fit_decode(rows: pd.DataFrame, c: CostModel, tp: int) -> Fitted:
    d = _need(rows, "decode", 4)
    b = d["batch"].to_numpy(float)
    ctx = d["context"].to_numpy(float)
    y = d["seconds"].to_numpy(float)
    # log-efficiencies keep the search well scaled across orders of magnitude: the decode
    # formula's two terms at efficiency 1 (the cost model's own coefficients)
    unit = c.with_overrides({"decode_bw_eff": 1.0, "decode_compute_eff": 1.0}).decode_coefficients(tp)
    mem0 = unit.mem_s(b, ctx)
    comp0 = unit.comp_s(b)

    def model(x: np.ndarray) -> np.ndarray:
        o, le_bw, le_c = x
        return o + np.maximum(mem0 / math.exp(le_bw), comp0 / math.exp(le_c))

    lo, hi = [0.0, math.log(1e-9), math.log(1e-9)], [1.0, math.log(10.0), math.log(10.0)]
    starts = [[float(np.min(y)) * 0.9, math.log(0.5), math.log(0.5)],
              [float(np.min(y)) * 0.5, math.log(0.01), math.log(0.001)],
              [0.0, math.log(0.001), math.log(1e-4)]]
    x = _solve(lambda x: model(x) - y, starts, lo, hi, float(np.median(y)) * 0.1)
    fitted = {"decode_overhead_s": float(x[0]), "decode_bw_eff": math.exp(x[1]),
              "decode_compute_eff": math.exp(x[2])}
    cost = c.with_overrides(fitted, source="calibration (decode)")
    pred = np.array([cost.decode_step_s(tp, int(bi), ci) for bi, ci in zip(b, ctx, strict=True)])
    return cost, quality("decode", y, pred, fitted), y, pred


def fit_prefill(rows: pd.DataFrame, c: CostModel, tp: int) -> Fitted:
    """Prefill time = measured time of a one-token request minus the one decode step the
    decode model already charges for that token."""
    d = _need(rows, "prefill", 2)
    new = d["new"].to_numpy(float)
    cached = d["cached"].to_numpy(float)
    first = np.array([c.decode_step_s(tp, 1, n + k) for n, k in zip(new, cached, strict=True)])
    y = np.maximum(d["seconds"].to_numpy(float) - first, 1e-6)
    flops = 2 * c.active_params * new + 4 * c.layers * c.d_model * new * (cached + new / 2)
    base = flops / (tp * c.peak_flops)
    x = _solve(lambda x: base / math.exp(x[0]) - y, [[math.log(0.1)], [math.log(1e-3)]],
               [math.log(1e-9)], [math.log(10.0)], float(np.median(y)) * 0.1)
    fitted = {"prefill_eff": math.exp(x[0])}
    cost = c.with_overrides(fitted, source="calibration (prefill)")
    pred = np.array([cost.prefill_s(tp, n, k) for n, k in zip(new, cached, strict=True)])
    hits = int((cached > 0).sum())
    return cost, quality("prefill", y, pred, fitted, note=f"{hits} with prefix-cache hits"), y, pred


def fit_kv(rows: pd.DataFrame, c: CostModel, tp: int) -> Fitted:
    """Choose ``hbm_bytes`` (at ``gpu_mem_util`` 1) so the model's KV capacity per engine is
    the engine's measured one: exact by construction."""
    d = _need(rows, "kv")
    cap = float(d["kv_capacity"].min())
    hbm = (cap * c.kv_bytes_per_token + c.weight_bytes) / tp + 1.0
    cost = c.with_overrides({"gpu_mem_util": 1.0, "hbm_bytes": hbm}, source="calibration (kv)")
    pred = np.full(len(d), float(cost.kv_capacity_tokens(tp)))
    y = d["kv_capacity"].to_numpy(float)
    return cost, quality("kv_capacity", y, pred, {"hbm_bytes": hbm}, note="tokens, not seconds",
                         constant=True), y, pred


def fit_train(rows: pd.DataFrame, c: CostModel) -> Fitted:
    d = _need(rows, "train", 2)
    flops = np.array([n * c.train_flops(t) for n, t in zip(d["samples"], d["tokens_each"], strict=True)])
    world = d["world"].to_numpy(float)
    y = d["seconds"].to_numpy(float)
    base = flops / (world * c.peak_flops)
    x = _solve(lambda x: base / math.exp(x[0]) - y, [[math.log(0.1)], [math.log(1e-3)]],
               [math.log(1e-9)], [math.log(10.0)], float(np.median(y)) * 0.1)
    fitted = {"train_mfu": math.exp(x[0])}
    cost = c.with_overrides(fitted, source="calibration (train)")
    pred = np.array([cost.train_s(f, int(w)) for f, w in zip(flops, world, strict=True)])
    worlds = sorted({int(w) for w in world})
    return cost, quality("train", y, pred, fitted, note=f"data-parallel widths {worlds}"), y, pred


def fit_constant(rows: pd.DataFrame, component: str, name: str, c: CostModel,
                 note: str = "") -> Fitted:
    d = _need(rows, component)
    y = d["seconds"].to_numpy(float)
    value = float(np.mean(y))
    cost = c.with_overrides({name: value}, source=f"calibration ({component})")
    pred = np.full(len(y), value)
    return cost, quality(component, y, pred, {name: value}, note=note, constant=True), y, pred


_DIRECTIONS = {"to_train": "train", "to_rollout": "rollout"}


def fit_switch(rows: pd.DataFrame, c: CostModel) -> Fitted:
    """Role switches per direction (``switch_to_<role>_s`` and its ``_per_gpu_s`` slope),
    because live the two differ several-fold (engines boot going to rollout; the trainer
    grows one rank at a time going to train) and a group costs more than one GPU.

    ``gpus`` on a row is how many GPUs switched together. A direction measured at one group
    size gets its *median* (a switch that overlapped another process's engine boot on a
    shared host is an outlier) and no slope; at two or more sizes a robust line
    ``seconds = constant + slope * (gpus - 1)``. ``switch_s`` becomes the cheapest measured
    switch: with both directions set the simulator charges it for none, and
    ``sim/bound.py`` takes it as the cheapest switch, so its bound stays a lower bound.
    Rows without a direction fit ``switch_s`` alone.
    """
    d = _need(rows, "switch")
    y = d["seconds"].to_numpy(float)
    kinds = d["kind"].fillna("switch").astype(str).to_numpy()
    gpus = (d["gpus"].fillna(1) if "gpus" in d.columns else pd.Series(1.0, index=d.index)).to_numpy(float)
    fitted: dict[str, float] = {}
    notes: list[str] = []
    for kind, role in _DIRECTIONS.items():
        m = kinds == kind
        if not m.any():
            continue
        yk, extra = y[m], gpus[m] - 1
        sizes = sorted({int(g) for g in gpus[m]})
        if len(sizes) < 2:
            const, slope = float(np.median(yk)), 0.0
        else:
            x = _solve(lambda x, yk=yk, extra=extra: x[0] + x[1] * extra - yk,
                       [[float(np.min(yk)), 0.0]], [0.0, 0.0], [3600.0, 3600.0], float(np.median(yk)) * 0.1)
            const, slope = float(x[0]), float(x[1])
        fitted[f"switch_to_{role}_s"] = const
        fitted[f"switch_to_{role}_per_gpu_s"] = slope
        notes.append(f"{kind} GPUs {sizes}" if len(sizes) > 1 else f"{kind} at {sizes[0]} GPUs only: no slope")
    if fitted:
        fitted["switch_s"] = min(v for k, v in fitted.items() if not k.endswith("_per_gpu_s"))
    else:
        fitted["switch_s"] = float(np.median(y))
        notes.append("no direction: one constant")
    cost = c.with_overrides(fitted, source="calibration (switch)")
    roles = [_DIRECTIONS.get(k, "switch") for k in kinds]
    pred = np.array([cost.switch_seconds(r, int(g)) for r, g in zip(roles, gpus, strict=True)])
    return cost, quality("switch", y, pred, fitted, note="; ".join(notes)), y, pred


def fit_sync(rows: pd.DataFrame, c: CostModel) -> Fitted:
    """``sync_latency_s + bytes / sync_bw``; the simulator syncs the whole model, so a
    single size (no partial reloads measured) fits the latency alone."""
    d = _need(rows, "sync")
    nbytes = d["bytes"].to_numpy(float)
    y = d["seconds"].to_numpy(float)
    if len(np.unique(nbytes)) < 2:
        fitted = {"sync_latency_s": float(np.mean(y)), "sync_bw": 1e16}
        note = "one size measured: latency only"
    else:
        x = _solve(lambda x: x[0] + nbytes / math.exp(x[1]) - y,
                   [[float(np.min(y)), math.log(1e9)], [0.0, math.log(1e8)]],
                   [0.0, math.log(1e3)], [3600.0, math.log(1e16)], float(np.median(y)) * 0.1)
        fitted = {"sync_latency_s": float(x[0]), "sync_bw": math.exp(x[1])}
        note = f"{len(np.unique(nbytes))} sizes"
    cost = c.with_overrides(fitted, source="calibration (sync)")
    pred = fitted["sync_latency_s"] + nbytes / fitted["sync_bw"]
    return cost, quality("sync", y, pred, fitted, note=note), y, pred


# ---------------------------------------------------------------------------- all
def fit_all(rows: pd.DataFrame, base: CostModel, tp: int) -> Calibration:
    """Fit every component in order (decode before prefill: prefill subtracts a decode
    step). ``base`` carries the model shape and the machine's nominal peaks."""
    cost = base
    out: list[FitQuality] = []
    preds: list[pd.DataFrame] = []

    def keep(step: Fitted) -> None:
        nonlocal cost
        cost, q, y, pred = step
        out.append(q)
        preds.append(pd.DataFrame({"component": q.component, "measured": y, "predicted": pred}))

    keep(fit_decode(rows, cost, tp))
    keep(fit_prefill(rows, cost, tp))
    keep(fit_kv(rows, cost, tp))
    keep(fit_train(rows, cost))
    keep(fit_constant(rows, "optimizer", "optimizer_step_s", cost,
                                   note="AdamW + export + publish"))
    keep(fit_sync(rows, cost))
    keep(fit_switch(rows, cost))
    # the live backend moves no KV between engines: a migrated trajectory re-prefills
    cost = replace(cost, kv_transfer_bw=1e3)
    return Calibration(cost, tuple(out), pd.concat(preds, ignore_index=True))


def tool_summary(rows: pd.DataFrame) -> dict[str, float]:
    """Median seconds per kind of tool call (the trace carries tool time; this is for the
    report: does the environment's real tool time match what the trace records?)."""
    d = rows[rows["component"] == "tool"]
    return {str(k): float(g["seconds"].median()) for k, g in d.groupby("kind")}
