"""The fidelity report: live and simulated timelines one above the other, the per-step
error next to the live run's own spread, GPU-time per state, the order of role changes
and weight syncs, and -- when the cost file came from ``rlsched calibrate`` -- the fit of
each cost-model component (measured against the fitted formula).

Self-contained HTML (plots inlined as PNG), like ``rlsched report``'s page.
"""

from __future__ import annotations

import base64
import html
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from .fidelity import FidelityResult
from .plots import plot_timeline
from .style import png_bytes, styled, time_unit
from .tables import CSS, SCRIPT, fmt_table


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></figure>'


@styled
def plot_timelines(result: FidelityResult) -> Figure:
    """Live (top) and simulated (bottom) per-GPU timelines on one time axis."""
    horizon = max(float(result.live.meta["makespan_seconds"]), float(result.sim.meta["makespan_seconds"]))
    fig = Figure(figsize=(11.0, 6.5), layout="constrained")
    top, bottom = fig.subplots(2, 1)
    n = int(result.live.meta["num_gpus"])
    for ax, rec, title in ((top, result.live, f"live: {result.summary['policy']}"),
                           (bottom, result.sim, "simulated replay (same trace, policy, config, cost model)")):
        span = float(rec.meta["makespan_seconds"])
        plot_timeline(rec.intervals, n, span, ax=ax, title=title)
        div, _unit = time_unit(span)
        ax.set_xlim(0, horizon / div)  # one time range for both, so the eye can compare
        for t in rec.steps["time"]:
            ax.axvline(t / div, color="black", lw=0.8, ls="--")
    return fig


@styled
def plot_step_errors(steps: pd.DataFrame) -> Figure:
    fig = Figure(figsize=(9.0, 3.6), layout="constrained")
    ax = fig.add_subplot()
    x = steps["step"].to_numpy()
    w = 0.28 if "repeat_seconds" in steps else 0.4
    ax.bar(x - w / 2 if w == 0.4 else x - w, steps["live_seconds"], w, label="live", color="#332288")
    if "repeat_seconds" in steps:
        ax.bar(x, steps["repeat_seconds"], w, label="live (repeat)", color="#88CCEE")
    ax.bar(x + w / 2 if w == 0.4 else x + w, steps["sim_seconds"], w, label="simulated", color="#CC6677")
    ax.set_xlabel("step")
    ax.set_ylabel("wall seconds")
    ax.set_xticks(x)
    ax.legend()
    ax.set_title("wall time per optimizer step")
    return fig


@styled
def plot_calibration(pred: pd.DataFrame) -> Figure:
    """Measured vs. predicted per component (log-log; the diagonal is a perfect fit)."""
    comps = [c for c in pred["component"].unique() if c != "kv_capacity"]
    cols = min(4, max(1, len(comps)))
    rows = int(np.ceil(len(comps) / cols))
    fig = Figure(figsize=(3.2 * cols, 3.0 * rows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
    for ax, comp in zip(axes, comps, strict=False):
        d = pred[pred["component"] == comp]
        y, p = d["measured"].to_numpy(float), d["predicted"].to_numpy(float)
        ax.scatter(y, p, s=10, alpha=0.7)
        lo = max(min(y.min(), p.min()), 1e-6)
        hi = max(y.max(), p.max())
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(NullFormatter())  # minor labels collide on short ranges
        ax.set_title(comp, fontsize=10)
        ax.set_xlabel("measured (s)")
        ax.set_ylabel("cost model (s)")
    for ax in axes[len(comps):]:
        ax.set_visible(False)
    return fig


def calibration_section(cost_file: Path | None) -> str:
    """The fit table and plot of a ``rlsched calibrate`` file ('' for any other file)."""
    if cost_file is None or cost_file.suffix != ".toml":
        return ""
    try:
        data = tomllib.loads(cost_file.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError, ValueError):
        return ""
    cal = data.get("calibration")
    if not isinstance(cal, dict) or not isinstance(cal.get("fit"), dict):
        return ""
    rows = [{"component": k, **{c: v for c, v in q.items() if not c.startswith("fitted_")},
             "fitted": ", ".join(f"{c[7:]}={v:.4g}" for c, v in q.items() if c.startswith("fitted_"))}
            for k, q in cal["fit"].items() if isinstance(q, dict)]
    out = [f"<h2>Calibration ({html.escape(cost_file.name)})</h2>",
           "<p class='note'>Each component fitted in the cost model's own formula; R² is blank for "
           "a constant; worst residual is the largest |measured - model| (seconds, and % of that "
           "measurement).</p>", fmt_table(pd.DataFrame(rows), digits=4)]
    tools = cal.get("tools_median_seconds")
    if isinstance(tools, dict) and tools:
        out.append("<p class='note'>Tool calls in the shipped environment (median s): "
                   + html.escape(", ".join(f"{k} {v:.3f}" for k, v in tools.items())) + "</p>")
    pred_name = cal.get("predictions_csv")
    if isinstance(pred_name, str) and (cost_file.parent / pred_name).is_file():
        pred = pd.read_csv(cost_file.parent / pred_name)
        out.append(_img(png_bytes(plot_calibration(pred)), "calibration: measured vs cost model"))
    return "\n".join(out)


def render(result: FidelityResult, cost_file: Path | None) -> str:
    s = result.summary
    title = f"rlsched fidelity: {s['policy']}"
    body = [f"<h1>{html.escape(title)}</h1>",
            f"<p class='note'>Live run <code>{html.escape(s['live_run'])}</code> replayed in the simulator; "
            f"generated {html.escape(time.strftime('%Y-%m-%d %H:%M:%S'))} by <code>rlsched fidelity</code>.</p>",
            "<h2>Per-step wall time</h2>", _summary_line(s),
            fmt_table(result.steps, digits=3), _img(png_bytes(plot_step_errors(result.steps)), "step times"),
            "<h2>Timelines (live above, simulated below)</h2>",
            "<p class='note'>Dashed lines: optimizer steps end.</p>",
            _img(png_bytes(plot_timelines(result)), "live and simulated timelines"),
            "<h2>GPU-time per state</h2>", fmt_table(result.states, digits=3),
            "<h2>Order of role changes and weight syncs</h2>",
            f"<p>{'Identical.' if s['order_identical'] else 'Differs at ' + html.escape(s['order_first_difference'])}</p>",
            fmt_table(_order_frame(result.live_order, result.sim_order), digits=0),
            calibration_section(cost_file)]
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>\n"
            + "\n".join(body) + f"\n<script>{SCRIPT}</script></body></html>\n")


def _summary_line(s: dict[str, Any]) -> str:
    spread = ("" if s.get("spread_median_pct") is None
              else f"; the live run's own run-to-run spread: median {s['spread_median_pct']:.1f}%")
    return (f"<p>Median per-step error {s['median_abs_error_pct']:.1f}% (p90 {s['p90_abs_error_pct']:.1f}%, "
            f"max {s['max_abs_error_pct']:.1f}%) over {s['steps']} steps{html.escape(spread)}. Total: live "
            f"{s['live_total_seconds']:.1f}s, simulated {s['sim_total_seconds']:.1f}s. Median trajectory "
            f"(dispatch to finish): live {s['trajectory_seconds_live']:.2f}s, simulated "
            f"{s['trajectory_seconds_sim']:.2f}s.</p>")


def _order_frame(live: list[str], sim: list[str]) -> pd.DataFrame:
    n = max(len(live), len(sim))
    return pd.DataFrame({"#": range(n), "live": live + [""] * (n - len(live)),
                         "simulated": sim + [""] * (n - len(sim))})


def write_fidelity_report(result: FidelityResult, out_dir: Path, *, cost_file: Path | None = None) -> Path:
    path = Path(out_dir) / "fidelity.html"
    path.write_text(render(result, cost_file))
    return path
