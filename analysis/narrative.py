"""A few sentences per policy saying where its GPU-time went, generated from its
breakdown and summary row, so the reader gets the story before the plots."""

from __future__ import annotations

import html
import math
from typing import Any

import pandas as pd

from .style import time_unit

MIN_SHARE = 0.01  # causes under 1% of GPU-time are folded into "other"
MAX_CAUSES = 7  # the rest is summed as "everything else"


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%" if x >= 0.01 else f"{x * 100:.1f}%"


def _duration(seconds: float) -> str:
    div, unit = time_unit(seconds)
    return f"{seconds / div:.3g} {unit}"


def _join(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def held_back(row: dict[str, Any]) -> str:
    """What held its steps back (:mod:`.critical`), when the solo times are known: of the
    time its steps took beyond their longest trajectories alone, the shares of the start
    delays, the tail's slowdown and what came after the rollouts."""
    parts = {"the tail running slower than alone": row.get("steps_tail_slowdown_s", math.nan),
             "training after the rollout": row.get("steps_after_rollout_s", math.nan),
             "waiting to start": row.get("steps_start_delay_s", math.nan)}
    vals = [float(v) if isinstance(v, int | float) else math.nan for v in parts.values()]
    over = sum(vals)
    if not (math.isfinite(over) and over > 0):
        return ""
    shares = sorted(zip(vals, parts, strict=True), reverse=True)
    k = row.get("max_staleness", 0)
    overlap = f" (with staleness {k} each step's link spans {k + 1} steps)" if k else ""
    return (f"; its steps took {_duration(over)} beyond their longest trajectories alone{overlap}: "
            + _join([f"{_pct(v / over)} {part}" for v, part in shares if v / over >= 0.005]))


def describe(name: str, row: dict[str, Any], breakdown: pd.DataFrame) -> str:
    """HTML (escaped) sentences for one policy."""
    bd = breakdown.sort_values("fraction", ascending=False)
    big = bd[bd["fraction"] >= MIN_SHARE].head(MAX_CAUSES)
    items = [f"{_pct(f)} {c}" for c, f in zip(big["cause"], big["fraction"], strict=True)]
    rest = float(bd["fraction"].sum() - big["fraction"].sum())
    if rest >= 0.005:
        items.append(f"{_pct(rest)} on everything else")
    text = f"{name} spent {_join(items)} of its GPU-time"
    util = row.get("gpu_utilization", math.nan)
    if isinstance(util, float) and math.isfinite(util):
        text += f" (utilization {_pct(util)})"
    text += f". Makespan {_duration(float(row['sim_seconds']))} for {row['steps']} steps"
    lb = row.get("lower_bound_seconds", math.nan)
    if isinstance(lb, float) and math.isfinite(lb) and lb > 0:
        text += f", {row['gap_to_bound_pct']:.0f}% above the lower bound of {_duration(lb)}"
    text += held_back(row)
    text += f". Max staleness {row['max_staleness']}"
    lost = int(row.get("lost_trajectories", 0))
    text += f"; {lost} trajectories lost" + (" (a bug: every trajectory must end trained or dropped)" if lost else "")
    dropped = int(row.get("dropped_trajectories", 0))
    if dropped:
        text += f"; {dropped} dropped"
    return html.escape(text + ".")
