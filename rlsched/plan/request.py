"""What ``rlsched plan`` is asked (:class:`PlanRequest`) and what it answers
(:class:`PlanResult`): records of their own, so the phases (:mod:`.checks`) and the
orchestration (:mod:`.planner`) both import them and neither imports the other back."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from rlsched.cluster.config import RunConfig
from rlsched.plan.search import SearchResult
from rlsched.sim.cost import CostModel


@dataclass(frozen=True)
class PlanRequest:
    trace_path: Path
    trace: pd.DataFrame  # the canonical trace read from trace_path
    run: RunConfig
    cost: CostModel
    live: dict[str, Any] = field(default_factory=dict)
    max_staleness: int = 1
    budget_minutes: float = 2.0
    max_trials: int | None = None
    seed: int = 0
    workers: int = 2
    ray: str | None = None
    policies: tuple[str, ...] | None = None
    resamples: int = 5
    top: int = 3
    flag_pct: float = 5.0
    sensitivity: bool = True
    report: bool = True
    #: Other files read (--config, --cost): an --out --force that holds them must not delete them.
    inputs: tuple[Path, ...] = ()
    #: The trace file's SHA-256 and size when ``trace`` was read (``rlsched.traces.digest.
    #: trace_meta``), for the report's run records; taken at load, as the search may run for
    #: minutes while the file changes. Empty: the records name the trace by path only.
    trace_digest: dict[str, Any] = field(default_factory=dict)


@dataclass
class PlanResult:
    ranking: pd.DataFrame
    robustness: pd.DataFrame
    sensitivity: pd.DataFrame
    recommended: str
    notes: list[str]
    search: SearchResult
    simulations: int
    wall_seconds: float
    out: Path
    report: Path | None = None
