"""Run one policy on one trace in the simulator and write its run record."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import ConfigError, shown
from rlsched.cluster.faults import FaultSchedule
from rlsched.cluster.ids import TrajStatus
from rlsched.cluster.loop import RunMeta
from rlsched.cluster.loop.trainer_queue import STEP_COLUMNS
from rlsched.cluster.policy import Policy
from rlsched.cluster.record import RunRecorder

from .bound import bound_terms, kept_solo_s, turn_solo_seconds
from .cost import CostModel
from .driver import Progress, SimDriver, SimResult
from .invariants import check_result
from .processing import group_flops, processor_charge
from .workload import Batches, Workload


def check_tool_targets(schedule: FaultSchedule, batches: Batches) -> None:
    """A tool fault's ``trajectory`` must be one this run replays (its id in the run: the
    trace's id, ``<id>#2`` for a later draw). A typo or an id of the trace's steps the run
    never reaches armed a hang that could never fire, yet summary.csv and the report
    counted it among the run's faults (only meta.json's ``armed_never_hit`` said)."""
    targets = [f for f in schedule.faults if f.kind == "tool" and f.trajectory is not None]
    if not targets:
        return
    ids = [rid for batch in batches for rid, _ in batch]
    known = set(ids)
    for f in targets:
        if f.trajectory not in known:
            at = f"at={f.at:g}" if f.at is not None else f"per_hour={f.per_hour:g}"
            example = f", e.g. {ids[0]!r}" if ids else ""
            raise ConfigError(f"faults: fault 'tool' {at}: trajectory={shown(f.trajectory)}: not a "
                              f"trajectory this run replays ({len(known):,} of them{example}); "
                              "expected the id of one it replays")


@dataclass(frozen=True)
class SimOutcome:
    result: SimResult
    lower_bound_seconds: float
    record_dir: Path | None
    # the bound's terms (``sim.bound.bound_terms``; the bound is the largest): which one binds
    bound_terms: dict[str, float] = field(default_factory=dict)


def simulate(
    workload: Workload,
    batches: Batches,
    policy: Policy,
    config: RunConfig,
    cost: CostModel,
    *,
    out_dir: Path | None = None,
    spec: str | None = None,
    meta: dict[str, Any] | None = None,
    progress: Progress | None = None,
    faults: FaultSchedule | None = None,
) -> SimOutcome:
    """Replay ``batches`` under ``policy``; write a run record to ``out_dir`` if given. The
    record holds no host time, so two replays write the same bytes; a caller that wants
    the wall time measures it (``rlsched compare`` writes ``timing.csv``).

    ``faults`` (default: ``config.faults``, the ``[faults]`` table) injects failures; see
    :mod:`rlsched.cluster.faults`. The record's meta then has ``faults`` (what they cost,
    :data:`rlsched.sim.faults.STAT_KEYS`) and ``fault_schedule``.
    """
    schedule = faults if faults is not None else config.faults
    if schedule is not None and not isinstance(schedule, FaultSchedule):
        raise TypeError(f"simulate(faults=...): expected a FaultSchedule, got {type(schedule).__name__}")
    if schedule:
        schedule.check_gpus(config.gpus)
        check_tool_targets(schedule, batches)
    recorder = RunRecorder(out_dir) if out_dir is not None else None
    charge = processor_charge(workload, cost) if config.processor else None
    driver = SimDriver(
        workload, batches, policy, config, cost, recorder=recorder, progress=progress, charge=charge,
        faults=schedule or None,
    )
    result = driver.run()
    kept = {t: ts.turns_done for t, ts in result.state.trajs.items()}
    best_flops = None
    if config.processor:  # the cheapest charge: each step's groups packed in one micro-batch
        best_flops = {}
        for batch in batches:
            members = [(rid, workload.index[tr], kept[rid]) for rid, tr in batch]
            _, charged = group_flops(workload, cost, members)
            for rid, i, k in members:
                s = int(workload.start[i])
                n = charged.get(rid, 0)
                ctx = int((workload.prompt[s : s + k] + workload.output[s : s + k]).sum())
                best_flops[rid] = cost.train_flops(n, ctx - n) if n else 0.0
    turn_solo = turn_solo_seconds(workload, cost, config.tp)
    terms = bound_terms(
        workload, batches, cost, config, policy.max_staleness, policy.defers,
        turns_kept=kept, train_flops=best_flops,
        cut={t for t, ts in result.state.trajs.items() if ts.finish_status is not TrajStatus.DONE},
        dropped={t for t, ts in result.state.trajs.items() if ts.status is TrajStatus.DROPPED},
        trained_at={t: ts.trained_version for t, ts in result.state.trajs.items()
                    if ts.status is TrajStatus.TRAINED},
        turn_solo=turn_solo,
    )
    bound = float(max(terms.values()))
    solo = solo_seconds(workload, result, turn_solo[1]) if config.check or recorder is not None else None
    if config.check and result.complete:
        check_result(result, driver, solo)
    if recorder is not None:
        recorder.close(
            trajectory_table(result, workload, solo),
            pd.DataFrame(result.steps, columns=list(STEP_COLUMNS)),
            RunMeta(
                driver="sim",
                policy=spec or policy.name,
                policy_name=policy.name,
                num_gpus=config.gpus,
                tp=config.tp,
                num_steps=len(batches),
                steps_done=result.state.version,
                complete=result.complete,
                makespan_seconds=result.makespan,
                lower_bound_seconds=bound,
                max_staleness_bound=policy.max_staleness,
                seed=config.seed,
                config=_config_dict(config),
                events_processed=result.events_processed,
                faults=result.faults if schedule else None,
                fault_schedule=schedule.to_dict() if schedule else None,
                driver_fields={"cost_model": cost.to_dict()},
                extra=meta or {},
            ).to_dict(),
        )
    return SimOutcome(result, bound, out_dir, terms)


def _config_dict(config: RunConfig) -> dict[str, Any]:
    out = {k: getattr(config, k) for k in config.__dataclass_fields__}
    if isinstance(out.get("faults"), FaultSchedule):
        out["faults"] = out["faults"].to_dict()
    return out


def solo_seconds(workload: Workload, result: SimResult, turn_solo: np.ndarray) -> dict[str, float]:
    """Each trajectory's solo seconds over the turns it kept (``turn_solo``: each turn's, from
    :func:`~rlsched.sim.bound.turn_solo_seconds`): the bound's critical path of a
    trajectory, a lower bound on its rollout from first dispatch to finish, so what a run
    took beyond it is the tail's slowdown (:mod:`rlsched.analysis.critical`)."""
    cs = np.concatenate([[0.0], np.cumsum(turn_solo)])
    out = {}
    for tid, ts in result.state.trajs.items():
        t = result.trajs[tid]
        n = int(workload.turns[t.widx])
        out[tid] = float(kept_solo_s(cs, workload.env, int(t.first), min(ts.turns_done, n), n,
                                     ts.finish_status is TrajStatus.DONE))
    return out


def trajectory_table(result: SimResult, workload: Workload, solo: dict[str, float] | None = None) -> pd.DataFrame:
    """The record's trajectories table (``cluster.record.TRAJECTORY_COLUMNS``); ``solo``:
    :func:`solo_seconds` (NaN where missing)."""
    solo = solo or {}
    st = result.state
    rows = []
    for tid, ts in st.trajs.items():
        t = result.trajs[tid]
        trained = ts.status is TrajStatus.TRAINED
        rows.append((
            tid, ts.task_id, ts.step, ts.status.value,
            (ts.finish_status.value if ts.finish_status else ""),
            ts.dispatch_time, ts.finish_time, ts.trained_version, ts.min_version, ts.max_version,
            t.n_turns, ts.turns_done, t.prompt_kept, t.output_kept,
            (t.ctx if t.charged < 0 else t.charged) if trained else 0, t.wasted,
            ts.dispatches, ts.migrations, solo.get(tid, math.nan),
        ))
    cols = ["trajectory", "task_id", "step", "status", "finish_status", "dispatch_time",
            "finish_time", "trained_version", "min_version", "max_version", "turns_total",
            "turns_done", "prompt_tokens", "output_tokens", "trained_tokens", "wasted_tokens",
            "dispatches", "migrations", "solo_seconds"]
    df = pd.DataFrame(rows, columns=cols)
    for c in ("dispatch_time", "finish_time", "solo_seconds"):
        df[c] = df[c].astype(np.float64)
    return df


def batches_from_ids(workload: Workload, steps: Sequence[Sequence[str]]) -> list[list[tuple[str, str]]]:
    """Batches where run ids equal trace ids (no repeats)."""
    return [[(t, t) for t in step] for step in steps]
