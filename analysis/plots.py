"""The report's plots. Each takes plain data (DataFrames from the metrics modules) and an
optional ``ax``, draws on it and returns the axes, so callers can compose their own figures.

Readable at a glance: every plot has a title, axis units and a legend; a GPU state has one
colour everywhere (``style.STATE_COLORS``). Large clusters are binned (at most 128 GPU
rows x a few hundred time bins, exact GPU-time per cell) so 1024 GPUs x 48 steps draws in
well under a second and stays legible.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from rlsched.cluster.ids import GpuState

from .intervals import Grid, Spans, grid, spans
from .stream import EXACT_SPANS_MAX
from .style import (
    BUSY_LINE,
    HATCHES,
    POLICY_MARKERS,
    STATE_CMAP,
    STATE_LABELS,
    STATE_ORDER,
    UNRECORDED,
    UNRECORDED_COLOR,
    color,
    new_axes,
    policy_color,
    styled,
    time_unit,
)

if TYPE_CHECKING:
    from .stream import IntervalSummary
EXACT_TIMELINE_MAX_INTERVALS = EXACT_SPANS_MAX  # above this, the timeline is binned


def _state_legend(ax: Axes, states: Sequence[str], *, outside: bool = True, **kw: object) -> None:
    handles = [Patch(facecolor=color(s), edgecolor="#555555", linewidth=0.5, label=STATE_LABELS.get(s, s)) for s in states]
    if outside:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), **kw)
    else:
        ax.legend(handles=handles, **kw)


def _legend(ax: Axes) -> None:
    if ax.get_legend_handles_labels()[0]:  # an empty record draws no lines
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _source(
    intervals: pd.DataFrame | IntervalSummary, num_gpus: int, makespan: float, max_rows: int, bins: int,
) -> tuple[Spans | None, int, list[int], Callable[[], Grid]]:
    """(every span or None, how many, the state codes present, the binned grid on demand)
    of a run's intervals: a frame in memory, or their one-pass summary (which has the
    spans only when there are few, and its grid only for its own rows and bins)."""
    if isinstance(intervals, pd.DataFrame):
        sp = spans(intervals, makespan)
        return sp, int(sp.start.size), [int(c) for c in np.unique(sp.state)], \
            lambda: grid(sp, num_gpus, makespan, max_rows=max_rows, bins=bins)
    summ = intervals
    if summ.grid is None or summ.grid_shape != (-(-num_gpus // max(1, -(-num_gpus // max_rows))), bins):
        raise ValueError(f"the interval summary's grid is {summ.grid_shape}, the plot needs {max_rows} rows x {bins} bins")
    g = summ.grid
    return summ.exact, int(summ.spans.sum()), [int(c) for c in np.flatnonzero(summ.spans)], lambda: g


@styled
def plot_timeline(
    intervals: pd.DataFrame | IntervalSummary, num_gpus: int, makespan: float, *, ax: Axes | None = None,
    title: str = "GPU timeline", max_rows: int = 128, bins: int = 800,
) -> Axes:
    """Gantt chart of GPU states. Exact rectangles for small records; for large ones each
    row is a block of GPUs and each cell shows the state that held most of its GPU-time.
    ``intervals``: the record's frame, or its one-pass summary (``stream.summarize_intervals``)."""
    ax = new_axes(ax, (11.0, 4.5))
    div, unit = time_unit(makespan)
    sp, n_spans, codes, binned = _source(intervals, num_gpus, makespan, max_rows, bins)
    present = [STATE_ORDER[i] for i in codes]
    if sp is not None and n_spans <= EXACT_TIMELINE_MAX_INTERVALS and num_gpus <= max_rows:
        for code in np.unique(sp.state):
            m = sp.state == code
            x0, x1 = sp.start[m] / div, sp.end[m] / div
            y0 = sp.gpu_first[m].astype(float)
            y1 = y0 + sp.gpu_count[m]
            verts = np.stack([np.stack([x0, y0], 1), np.stack([x1, y0], 1), np.stack([x1, y1], 1), np.stack([x0, y1], 1)], 1)
            ax.add_collection(PolyCollection(verts, facecolors=color(STATE_ORDER[code]), edgecolors="none", linewidths=0))
        ax.set_xlim(0, max(makespan, 1e-9) / div)
        ax.set_ylim(num_gpus, 0)
        sub = ""
    else:
        gr = binned()
        dom = gr.dominant()
        ax.imshow(
            dom, cmap=STATE_CMAP, vmin=-0.5, vmax=len(STATE_ORDER) + 0.5, aspect="auto",
            interpolation="nearest", extent=(0, makespan / div, num_gpus, 0),
        )
        sub = f" ({gr.gpus_per_row} GPUs per row, {makespan / bins / div:.3g} {unit} per column; dominant state)"
        if (dom == len(STATE_ORDER)).any():
            present = [*present, UNRECORDED]
    ax.set_title(title + sub, fontsize=11)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("GPU")
    ax.grid(False)
    if num_gpus <= 16:
        ax.set_yticks(np.arange(num_gpus) + 0.5, [str(g) for g in range(num_gpus)])
    _state_legend(ax, present)
    return ax


@styled
def plot_utilization(
    intervals: pd.DataFrame | IntervalSummary, num_gpus: int, makespan: float, *, ax: Axes | None = None,
    title: str = "GPU use over time", bins: int = 800,
) -> Axes:
    """Share of the cluster in each state over time (stacked: rollout states, then the
    trainer's, then the rest), with the busy share (generate + train) as a line.
    ``intervals`` as for :func:`plot_timeline`."""
    ax = new_axes(ax, (11.0, 3.8))
    div, unit = time_unit(makespan)
    # the same binning as the timeline's (cached), summed over its rows
    gr = _source(intervals, num_gpus, makespan, 128, bins)[3]()
    frac = gr.cluster_fractions()
    t = (np.arange(bins) + 0.5) * gr.dt / div
    present = [i for i in range(len(STATE_ORDER)) if frac[i].max() > 0]
    if present:
        ax.stackplot(t, frac[present], colors=[color(STATE_ORDER[i]) for i in present], linewidth=0)
    busy = frac[STATE_ORDER.index("generate")] + frac[STATE_ORDER.index("train")]
    ax.plot(t, busy, color=BUSY_LINE, linewidth=1.2)
    ax.set_xlim(0, max(makespan, 1e-9) / div)
    ax.set_ylim(0, 1)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("share of GPUs")
    ax.set_title(title)
    states = [STATE_ORDER[i] for i in present]
    handles = [Patch(facecolor=color(s), label=STATE_LABELS[s]) for s in reversed(states)]
    handles.append(Line2D([], [], color=BUSY_LINE, label="busy (generate + train)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return ax


@styled
def plot_breakdown(breakdowns: pd.DataFrame, summary: pd.DataFrame, *, ax: Axes | None = None) -> Axes:
    """One bar per policy: its makespan, split by each cause's share of GPU-time; the
    diamond marks the lower bound on the makespan (the gap is what any policy could gain)."""
    policies = list(dict.fromkeys(summary["policy"]))
    ax = new_axes(ax, (11.0, 1.2 + 0.55 * len(policies) + 1.5))
    longest = float(summary["sim_seconds"].max()) if len(summary) else 1.0
    div, unit = time_unit(longest)
    span = summary.set_index("policy")["sim_seconds"]
    bound = summary.set_index("policy")["lower_bound_seconds"]
    bd = breakdowns.copy()
    bd["key"] = list(zip(bd["state"], bd["cause"], strict=True))
    keys = list(dict.fromkeys(bd["key"]))
    hatch_of: dict[tuple[str, str], str] = {}
    for st in dict.fromkeys(k[0] for k in keys):
        for i, k in enumerate(k for k in keys if k[0] == st):
            hatch_of[k] = HATCHES[i % len(HATCHES)]
    y = np.arange(len(policies))
    left = np.zeros(len(policies))
    shown: set[tuple[str, str]] = set()
    handles = []
    for k in keys:
        sel = bd[bd["key"] == k].set_index("policy")["fraction"].reindex(policies).fillna(0.0)
        width = sel.to_numpy() * span.reindex(policies).to_numpy() / div
        if not (width > 0).any():
            continue
        fc = color(k[0]) if k[0] != UNRECORDED else UNRECORDED_COLOR
        ax.barh(y, width, left=left, color=fc, hatch=hatch_of[k], edgecolor="#333333", linewidth=0.3, height=0.6)
        left += width
        if k not in shown:
            shown.add(k)
            handles.append(Patch(facecolor=fc, hatch=hatch_of[k], edgecolor="#333333", linewidth=0.3, label=k[1]))
    for yi, p in zip(y, policies, strict=True):
        gap = summary.set_index("policy")["gap_to_bound_pct"].get(p, np.nan) if "gap_to_bound_pct" in summary else np.nan
        note = f" {span[p] / div:.3g} {unit}" + (f" (+{gap:.0f}% vs bound)" if np.isfinite(gap) else "")
        ax.text(left[yi], yi, note, va="center", ha="left", fontsize=9)
    if longest > 0:
        ax.set_xlim(0, longest / div * 1.3)
    lb = bound.reindex(policies).to_numpy(dtype=float) / div
    ok = np.isfinite(lb)
    if ok.any():
        ax.scatter(lb[ok], y[ok], marker="D", s=60, color="black", zorder=5)
        handles.append(Line2D([], [], marker="D", color="black", linestyle="none", label="lower bound"))
    ax.set_yticks(y, policies)
    ax.invert_yaxis()
    ax.set_xlabel(f"makespan ({unit}), split by share of GPU-time")
    ax.set_title("Where the GPU-time went, per policy")
    ax.grid(axis="y", visible=False)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return ax


# the parts of a step's link beyond its longest solo (summary.csv's steps_* columns): the
# colours of the GPU states each mostly is (switching, the tail, training)
HELD_PARTS: tuple[tuple[str, str, str], ...] = (
    ("steps_start_delay_s", "start delay (switches, syncs)", GpuState.SWITCH.value),
    ("steps_tail_slowdown_s", "tail slower than alone", GpuState.ROLLOUT_IDLE.value),
    ("steps_after_rollout_s", "training after the rollout", GpuState.TRAIN.value),
)


@styled
def plot_held_back(summary: pd.DataFrame, *, ax: Axes | None = None) -> Axes:
    """One bar per policy: the time its steps took beyond their longest trajectory alone
    (summed over the steps' links, :mod:`.critical`), split into its parts. A run without
    solo times (a live run) has no bar."""
    rows = summary[np.isfinite(summary["steps_tail_slowdown_s"].astype(float))]
    policies = list(dict.fromkeys(rows["policy"]))
    ax = new_axes(ax, (11.0, 1.2 + 0.55 * max(1, len(policies)) + 1.2))
    total = rows[[c for c, _, _ in HELD_PARTS]].astype(float).sum(axis=1)
    div, unit = time_unit(float(total.max()) if len(total) else 1.0)
    y = np.arange(len(policies))
    left = np.zeros(len(policies))
    by = rows.drop_duplicates("policy").set_index("policy")
    for col, lab, state in HELD_PARTS:
        width = by[col].reindex(policies).astype(float).to_numpy() / div
        ax.barh(y, width, left=left, color=color(state), edgecolor="#333333", linewidth=0.3, height=0.6, label=lab)
        left += width
    for yi in y:
        ax.text(left[yi], yi, f" {left[yi]:.3g} {unit}", va="center", ha="left", fontsize=9)
    right = float(left.max()) * 1.25 if len(policies) else 0.0
    if 0 < right < np.inf:  # (seconds near float's limit sum to inf: no finite axis to set)
        ax.set_xlim(0, right)
    ax.set_yticks(y, policies)
    ax.invert_yaxis()
    ax.set_xlabel(f"time beyond each step's longest trajectory alone, summed over the steps ({unit})")
    ax.set_title("What held the steps back")
    ax.grid(axis="y", visible=False)
    _legend(ax)
    return ax


@styled
def plot_step_times(step_times: pd.DataFrame, *, ax: Axes | None = None) -> Axes:
    """Wall time of every optimizer step, one line per policy."""
    ax = new_axes(ax, (9.0, 3.8))
    longest = float(step_times["seconds"].max()) if len(step_times) else 1.0
    div, unit = time_unit(longest)
    for i, (policy, df) in enumerate(step_times.groupby("policy", sort=False)):
        ax.plot(
            df["step"], df["seconds"] / div, marker=POLICY_MARKERS[i % len(POLICY_MARKERS)], markersize=5,
            color=policy_color(i), label=str(policy),
        )
    ax.set_xlabel("step")
    ax.set_ylabel(f"step time ({unit})")
    ax.set_ylim(bottom=0)
    ax.set_title("Time per optimizer step")
    ax.xaxis.get_major_locator().set_params(integer=True)
    _legend(ax)
    return ax


@styled
def plot_staleness(staleness: pd.DataFrame, *, ax: Axes | None = None) -> Axes:
    """Share of trained trajectories per staleness (versions behind the trainer)."""
    ax = new_axes(ax, (9.0, 3.6))
    policies = list(dict.fromkeys(staleness["policy"]))
    values = np.sort(staleness["staleness"].unique()) if len(staleness) else np.array([0])
    width = 0.8 / max(len(policies), 1)
    for i, p in enumerate(policies):
        s = staleness[staleness["policy"] == p].set_index("staleness")["fraction"].reindex(values).fillna(0.0)
        x = np.arange(len(values)) + (i - (len(policies) - 1) / 2) * width
        ax.bar(
            x, s.to_numpy(), width=width, label=str(p), color=policy_color(i), hatch=HATCHES[i % len(HATCHES)],
            edgecolor="white", linewidth=0.3,
        )
    ax.set_xticks(np.arange(len(values)), [str(v) for v in values])
    ax.set_xlabel("staleness (trainer version - oldest weights version of the trajectory)")
    ax.set_ylabel("share of trained trajectories")
    ax.set_ylim(0, 1.05)
    ax.set_title("Staleness of trained trajectories")
    _legend(ax)
    return ax


@styled
def plot_length_bias(length_bias: pd.DataFrame, *, ax: Axes | None = None) -> Axes:
    """Per step: how much longer (> 0) or shorter (< 0) the trajectories a step trained
    were than that step's batch, in % of mean turns; one line per policy."""
    ax = new_axes(ax, (9.0, 3.4))
    for i, (policy, df) in enumerate(length_bias.groupby("policy", sort=False)):
        df = df.dropna(subset=["bias_pct"])
        ax.plot(
            df["step"], df["bias_pct"], marker=POLICY_MARKERS[i % len(POLICY_MARKERS)], markersize=5,
            color=policy_color(i), label=str(policy),
        )
    ax.axhline(0.0, color="#555555", linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("trained vs. batch length (%)")
    ax.set_title("Length bias: mean turns of trained trajectories vs. their step's batch")
    ax.xaxis.get_major_locator().set_params(integer=True)
    _legend(ax)
    return ax


LEARNING_PANELS = (  # (title, y label, [(column, line label)])
    ("Mean reward of the trained trajectories (band: within-group spread)", "reward", [("reward_mean", "")]),
    ("Policy-gradient loss (token mean)", "loss", [("loss", "")]),
    ("KL to the starting policy (k3, token mean)", "KL (nats)", [("kl_to_start", "")]),
    ("Token staleness (trainer version - generating version)", "versions",
     [("token_staleness_mean", "mean"), ("token_staleness_max", "max")]),
    ("PPO clip and behaviour-weight truncation", "share of trained tokens",
     [("clip_fraction", "clipped"), ("truncated_fraction", "truncated")]),
)


@styled
def plot_learning(learning: pd.DataFrame) -> Figure:
    """Five panels against the optimizer step, one colour per policy: reward (with its
    within-group spread as a band), loss, KL to the starting policy, token staleness,
    clip / truncation fractions. ``learning``: :func:`rlsched.analysis.learning.learning_table`
    rows with a ``policy`` column."""
    fig = Figure(figsize=(9.0, 2.6 * len(LEARNING_PANELS)), layout="constrained")
    axes = fig.subplots(len(LEARNING_PANELS), 1, sharex=True)
    styles = ("-", "--")
    for ax, (title, ylabel, lines) in zip(axes, LEARNING_PANELS, strict=True):
        for i, (policy, df) in enumerate(learning.groupby("policy", sort=False)):
            for j, (col, what) in enumerate(lines):
                d = df.dropna(subset=[col])
                if d.empty:
                    continue
                name = f"{policy} {what}".strip()
                ax.plot(d["step"], d[col], linestyle=styles[j % 2], marker=POLICY_MARKERS[i % len(POLICY_MARKERS)],
                        markersize=4, color=policy_color(i), label=name)
                if col == "reward_mean" and d["reward_group_std"].notna().any():
                    ax.fill_between(d["step"], d[col] - d["reward_group_std"].fillna(0.0),
                                    d[col] + d["reward_group_std"].fillna(0.0), color=policy_color(i), alpha=0.15,
                                    linewidth=0)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        if ax.get_legend_handles_labels()[0]:
            _legend(ax)
    axes[-1].set_xlabel("step (version trained at)")
    axes[-1].xaxis.get_major_locator().set_params(integer=True)
    return fig


def trajectory_lengths(trace: pd.DataFrame) -> pd.DataFrame:
    """Per trajectory of a trace: turns, context tokens (prompt + output), env seconds."""
    g = trace.groupby("trajectory_id", sort=False)
    out = g.agg(turns=("turn", "size"), prompt=("prompt_tokens", "sum"), output=("output_tokens", "sum"), env_seconds=("env_seconds", "sum"))
    out["tokens"] = out["prompt"] + out["output"]
    return out[["turns", "tokens", "output", "env_seconds"]].reset_index(drop=True)


@styled
def plot_length_cdfs(lengths: pd.DataFrame, *, axes: Sequence[Axes] | None = None, title: str = "") -> list[Axes]:
    """CDFs of trajectory length in turns, context tokens and environment time (log x):
    the long tail every policy has to live with."""
    if axes is None:
        fig = Figure(figsize=(12.0, 3.4), layout="constrained")
        axes = list(fig.subplots(1, 3))
        if title:
            fig.suptitle(title, fontweight="bold")
    panels = (("turns", "turns per trajectory"), ("tokens", "context tokens per trajectory"), ("env_seconds", "tool time per trajectory (s)"))
    for ax, (col, xl) in zip(axes, panels, strict=True):
        v = np.sort(lengths[col].to_numpy(dtype=float))
        v = v[v > 0]
        if v.size:
            p = np.arange(1, v.size + 1) / v.size
            ax.step(v, p, where="post", color="#0072B2")
            ax.set_xscale("log")
            for q, ls in ((0.5, ":"), (0.99, "--")):
                x = float(np.quantile(v, q))
                ax.axvline(x, color="#D55E00", linestyle=ls, linewidth=1, label=f"p{int(q * 100)} = {x:,.0f}")
            ax.legend(loc="lower right")
        ax.set_xlabel(xl)
        ax.set_ylabel("share of trajectories ≤ x")
        ax.set_ylim(0, 1.02)
    return list(axes)
