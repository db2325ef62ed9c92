"""What ``rlsched plan`` writes: the ranking table and ``recommended.toml``.

``recommended.toml`` is an ordinary config file (``rlsched.config`` format), so
``rlsched compare --config`` and ``rlsched run --config ... --live`` take it unchanged; it
is written by hand here (the standard library reads TOML but does not write it) and read
back through :func:`parse_config` before it is published, so a file the project cannot
load is never left behind.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import pandas as pd

from rlsched.cluster.config import RunConfig
from rlsched.config import parse_config
from rlsched.sim.cost import CostModel
from rlsched.toml_write import toml_table, toml_value

RANKING_COLUMNS = (
    "rank", "policy", "arm", "params", "steps_per_hour", "sph_mean", "sph_std", "sph_min",
    "resamples", "utilization", "max_staleness", "gap_to_bound_pct", "trained_tokens",
    "tokens_vs_colocated", "sim_seconds", "lower_bound_seconds", "feasible", "note",
    "flagged", "recommended", "trial",
)

_CLUSTER_KEYS = ("gpus", "tp")


def cost_overrides(cost: CostModel) -> dict[str, Any]:
    """The fields of ``cost`` that differ from the reference model (the ``[cost]`` table)."""
    from rlsched.sim.presets import default_cost

    ref = default_cost()  # (a flat --model none plan writes the fields that undo the preset)
    return {f.name: getattr(cost, f.name) for f in fields(cost)
            if getattr(cost, f.name) != getattr(ref, f.name)}


#: The ``[live]`` table written when the plan's own config has none: the planned cluster
#: (``[cluster] gpus``) is what the simulator replays, while ``[live] gpus`` is the host a
#: promoted run starts on -- here the 2-slot CPU setting of ``configs/live-cpu.toml``, so
#: ``rlsched run --config recommended.toml --live`` works on any machine. Edit it on a GPU host.
LIVE_HOST_DEFAULTS: dict[str, Any] = {
    "gpus": 2,
    "tp": 1,
    "tasks_per_step": 2,
    "samples_per_task": 2,
    "max_turns": 3,
    "max_tokens_per_turn": 32,
}


def recommended_toml(
    *,
    trace: Path,
    run: RunConfig,
    cost: CostModel,
    live: Mapping[str, Any],
    specs: Sequence[str],
    header: Sequence[str],
) -> str:
    """The config text; ``specs[0]`` is the recommendation, the rest are for comparison."""
    run_items = {f.name: getattr(run, f.name) for f in fields(run)}
    run_items.pop("check")
    run_items.pop("faults", None)  # a fault schedule is a test of the plan, not part of it
    lines = [f"# {h}" if h else "#" for h in header]
    lines += [f"trace = {toml_value(str(trace), 'recommended.toml: trace')}", ""]
    lines += toml_table("cluster", file="recommended.toml", items={k: run_items.pop(k) for k in _CLUSTER_KEYS})
    lines += ["", *toml_table("run", file="recommended.toml", items={k: v for k, v in run_items.items() if v is not None})]
    over = cost_overrides(cost)
    if over:
        lines += ["", *toml_table("cost", file="recommended.toml", items=over)]
    lines += ["", *toml_table("live", file="recommended.toml", items=live or LIVE_HOST_DEFAULTS)]
    for i, spec in enumerate(specs):
        note = "  # recommended" if i == 0 else "  # for comparison"
        lines += ["", "[[policy]]", f"spec = {toml_value(spec, 'recommended.toml: spec')}{note}"]
    return "\n".join(lines) + "\n"


def check_config_text(text: str, source: str) -> None:
    """Fail loudly if the project's own loader would reject the text."""
    try:
        parse_config(tomllib.loads(text), source=source)
    except tomllib.TOMLDecodeError as exc:  # a bug in the writer above, not a user error
        raise RuntimeError(f"{source}: wrote invalid TOML: {exc}") from None


def ranking_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Feasible configurations by steps/hour, then the rejected ones; ``rank`` from 1.
    Equal steps/hour go in the order the search found them (declared defaults first)."""
    df = pd.DataFrame(rows)
    for c in RANKING_COLUMNS:
        if c not in df.columns:
            df[c] = math.nan
    df = df.sort_values(["feasible", "steps_per_hour", "trial"], ascending=[False, False, True],
                        kind="mergesort").reset_index(drop=True)
    df["rank"] = range(1, len(df) + 1)
    first: dict[tuple[float, int], int] = {}
    for i, row in df.iterrows():  # rounding often maps two specs onto one schedule
        key = (round(float(row["sim_seconds"]), 6), int(row["trained_tokens"]))
        if key in first and not row["note"]:
            df.at[i, "note"] = f"same schedule as #{first[key]}"
        first.setdefault(key, int(row["rank"]))
    return df[list(RANKING_COLUMNS)]


def params_text(params: Mapping[str, Any]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    return " ".join(f"{k}={fmt(v)}" for k, v in params.items())
