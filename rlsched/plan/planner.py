"""``rlsched plan``: which policy configuration to run on this trace and cluster, and how
sure to be of it.

Four phases, all on the simulator:

1. **search** (:mod:`rlsched.plan.search`): Optuna TPE over every registered policy's
   declared parameters (:mod:`rlsched.plan.space`), successive halving on step prefixes,
   objective steps/hour at equal trained tokens within the staleness bound;
2. **robustness**: the best few distinct configurations replayed on bootstrap resamples of
   the trace's tasks; the mean winner is *flagged* when its worst resample falls more than
   ``flag_pct`` below the runner-up's mean, and then the runner-up is recommended;
3. **sensitivity**: the best configuration of each arm replayed at half and twice the GPUs
   and with the 5% longest trajectories removed or doubled -- does the choice change?
4. **output**: ``ranking.csv``, ``trials.csv``, ``robustness.csv``, ``sensitivity.csv``,
   ``recommended.toml`` (a config ``compare``/``run`` accept as is), ``plan.json`` (the
   search's cost) and, when the analysis package's report writer is installed, run
   records and ``report.html`` for the top candidates.

Phases 2 and 3 live in :mod:`rlsched.plan.checks`; what a plan is asked and answers
(:class:`PlanRequest`, :class:`PlanResult`) in :mod:`rlsched.plan.request`, which both
import. The budget covers all phases: the search stops early enough to leave time for the
fixed number of simulations the later phases need, estimated from the simulation speed
measured so far (so a loaded machine searches less rather than overrunning).
Output is written to a temporary sibling of ``--out`` and renamed into place when complete.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import ConfigError
from rlsched.compare import prepare_out_dir, publish, run_dir_name
from rlsched.plan.checks import (
    PlanProgress,
    choose,
    distinct_best,
    feasible_sorted,
    robustness,
    sensitivity,
    sensitivity_frames,
)
from rlsched.plan.evaluation import BASE, CachedRunner, Job, PlanSetup, make_runner
from rlsched.plan.output import (
    check_config_text,
    params_text,
    ranking_frame,
    recommended_toml,
)
from rlsched.plan.request import PlanRequest, PlanResult
from rlsched.plan.search import BASELINE, SearchResult, judge, search
from rlsched.plan.space import build_arms
from rlsched.traces.batches import check_draw
from rlsched.traces.digest import trace_location


def resolve_run(run: RunConfig, df: pd.DataFrame) -> RunConfig:
    """Pin ``tasks_per_step`` to what ``draw_batches`` would use, so the recommended config
    replays exactly the tasks that were planned on."""
    if run.tasks_per_step is not None or "step" in df.columns:
        return run
    tasks = int(df["task_id"].nunique())
    return replace(run, tasks_per_step=max(1, tasks // run.steps))


def _check(req: PlanRequest) -> None:
    if not req.budget_minutes > 0 or not math.isfinite(req.budget_minutes):
        raise ConfigError(f"--budget-minutes={req.budget_minutes}: expected a number > 0")
    if req.max_trials is not None and req.max_trials < 1:
        raise ConfigError(f"--trials={req.max_trials}: expected an integer >= 1")
    for name in ("resamples", "top"):  # (each is a full replay per configuration: bounded,
        # since the robustness check runs after the search's budget; --resamples 100000 ran on)
        if not 1 <= getattr(req, name) <= 100:
            raise ConfigError(f"--{name}={getattr(req, name)}: expected an integer from 1 to 100")
    if not 0 <= req.flag_pct < 100:
        raise ConfigError(f"--flag-pct={req.flag_pct}: expected a percentage in [0, 100)")
    check_draw(req.trace, req.run.tasks_per_step, req.run.samples_per_task, str(req.trace_path))


def _ranking(req: PlanRequest, res: SearchResult, steps: int, stats: pd.DataFrame,
             flags: dict[str, str], recommended: str) -> pd.DataFrame:
    base = res.baselines[steps]
    rows = []
    for spec, ev in res.full.items():
        v = judge(ev, base, req.max_staleness)
        st = stats.loc[spec] if spec in stats.index else None
        rows.append({
            "policy": spec, "arm": res.arm_of[spec], "params": params_text(res.params[spec]),
            "trial": res.trial_of[spec],
            "steps_per_hour": ev.steps_per_hour,
            "sph_mean": st["sph_mean"] if st is not None else math.nan,
            "sph_std": st["sph_std"] if st is not None else math.nan,
            "sph_min": st["sph_min"] if st is not None else math.nan,
            "resamples": int(st["resamples"]) if st is not None else 0,
            "utilization": ev.utilization, "max_staleness": ev.max_staleness,
            "gap_to_bound_pct": ev.gap_to_bound_pct, "trained_tokens": ev.trained_tokens,
            "tokens_vs_colocated": ev.trained_tokens / base.trained_tokens if base.trained_tokens else math.nan,
            "sim_seconds": ev.makespan, "lower_bound_seconds": ev.lower_bound,
            "feasible": v.feasible, "note": v.reason, "flagged": flags.get(spec, ""),
            "recommended": spec == recommended,
        })
    return ranking_frame(rows)


def _post_simulations(req: PlanRequest, arms: int) -> tuple[int, int]:
    """Simulations the later phases will run: (parallel ones, ones in this process)."""
    parallel = (req.top + 1) * req.resamples + (4 * (arms + 3) if req.sensitivity else 0)
    return parallel, (req.top + 1 if req.report else 0)


def _deadline(req: PlanRequest, t0: float, runner: CachedRunner, steps: int, arms: int) -> float:
    """When the search must stop so the later phases fit in the budget: their simulation
    count times the cost per simulated step measured so far (1.5x for the heavier
    sensitivity scenarios), plus the report's plots."""
    per_sim = 1.5 * runner.seconds_per_step() * steps
    parallel, local = _post_simulations(req, arms)
    reserve = per_sim * (parallel / max(1, runner.workers) + local)
    if req.report:
        reserve += 3.0 * (req.top + 1) + 5.0
    return t0 + 60.0 * req.budget_minutes - reserve


def _write_report(req: PlanRequest, setup: PlanSetup, specs: list[str], tmp: Path) -> Path | None:
    try:
        from rlsched.analysis.report import write_report
    except ImportError:
        return None
    from rlsched.plan.evaluation import _context
    from rlsched.policies import canonical_spec, make_policy
    from rlsched.sim.run import simulate

    workload, batches, run = _context(setup, BASE)
    trace = {**trace_location(req.trace_path), **req.trace_digest}  # (the bytes replayed)
    dirs = []
    for i, spec in enumerate(specs):
        policy = make_policy(spec)
        rd = tmp / "runs" / run_dir_name(spec, i)
        simulate(workload, batches, policy, run, setup.cost, out_dir=rd, spec=canonical_spec(policy),
                 meta={**trace, "spec_as_given": spec})
        dirs.append(rd)
    return write_report(dirs, tmp, title=f"rlsched plan: {req.trace_path.name}, {run.gpus} GPUs")


def plan(req: PlanRequest, out: Path, *, force: bool = False,
         progress: PlanProgress | None = None) -> PlanResult:
    """Run all phases and write ``out``; see the module docstring."""
    t0 = time.monotonic()
    _check(req)
    run = resolve_run(req.run, req.trace)
    arms = build_arms(req.policies, req.max_staleness, run.gpus // run.tp)
    setup = PlanSetup(req.trace, run, req.cost)
    tmp = prepare_out_dir(out, force, inputs=(req.trace_path, *req.inputs))
    runner: CachedRunner | None = None
    try:
        runner = make_runner(setup, req.workers, req.ray)
        if progress:
            progress("search", 0, 1, "colocated baseline")
        runner.map([Job(BASE, BASELINE, run.steps)])

        def deadline() -> float:
            return _deadline(req, t0, runner, run.steps, len(arms))

        budget_s = max(1.0, deadline() - time.monotonic())

        def on_search(n: int, elapsed: float, best: str) -> None:
            if progress:
                progress("search", min(elapsed, budget_s), budget_s, f"{n} trials, best {best}")

        res = search(arms, runner, run.steps, max_staleness=req.max_staleness, seed=req.seed,
                     deadline=deadline, max_trials=req.max_trials, min_trials=len(arms),
                     progress=on_search)
        phases = {"search": time.monotonic() - t0}
        if progress:
            progress("search", budget_s, budget_s, f"{len(res.trials)} trials")
        feasible = feasible_sorted(res, req.max_staleness, run.steps)
        cands = distinct_best(feasible, req.top)
        mark = time.monotonic()
        stats, boot = robustness(req, runner, cands, run.steps, progress)
        recommended, flags, notes = choose(stats, cands, req.flag_pct)
        phases["robustness"], mark = time.monotonic() - mark, time.monotonic()
        if req.sensitivity:
            sens, sens_detail = sensitivity(req, runner, res, setup, recommended, progress)
        else:
            sens, sens_detail = sensitivity_frames([], [])
        phases["sensitivity"], mark = time.monotonic() - mark, time.monotonic()
        ranking = _ranking(req, res, run.steps, stats, flags, recommended)

        ranking.to_csv(tmp / "ranking.csv", index=False)
        boot.to_csv(tmp / "robustness.csv", index=False)
        sens.to_csv(tmp / "sensitivity.csv", index=False)
        sens_detail.to_csv(tmp / "sensitivity_detail.csv", index=False)
        pd.DataFrame([{**t.__dict__, "params": params_text(t.params)} for t in res.trials]).to_csv(
            tmp / "trials.csv", index=False)
        counts = res.counts
        text = recommended_toml(
            trace=req.trace_path.absolute(), run=run, cost=req.cost, live=req.live,
            specs=list(dict.fromkeys([recommended, BASELINE])),
            header=[
                f"Recommended by `rlsched plan` (seed {req.seed}, {res.distinct} configurations tried, "
                f"max staleness {req.max_staleness}).",
                "Compare it with colocated:  rlsched compare --config recommended.toml --out DIR",
                "Run it live (the first [[policy]] is the default):  rlsched run --config recommended.toml --live --steps 2 --out DIR",
                "([cluster] is the planned cluster the simulator replays; [live] is the host a live run uses.)",
            ],
        )
        check_config_text(text, str(out / "recommended.toml"))
        (tmp / "recommended.toml").write_text(text)
        report = None
        if req.report:
            if progress:
                progress("report", 0, 1, "")
            order = list(dict.fromkeys([recommended, *cands, BASELINE]))
            written = _write_report(req, setup, order, tmp)
            report = out / written.name if written is not None else None
            if written is None:
                notes.append("analysis report writer not installed: no report.html")
            if progress:
                progress("report", 1, 1, "")
        phases["report"] = time.monotonic() - mark
        wall = time.monotonic() - t0
        over = wall - 60.0 * req.budget_minutes
        if over > 0:
            notes.append(f"took {over:.0f}s more than the {req.budget_minutes:g}-minute budget "
                         f"(simulations ran at {runner.seconds_per_step():.2f}s per step)")
        meta = {
            "trace": str(req.trace_path), "gpus": run.gpus, "tp": run.tp, "steps": run.steps,
            "tasks_per_step": run.tasks_per_step, "seed": req.seed,
            "max_staleness": req.max_staleness, "budget_minutes": req.budget_minutes,
            "max_trials": req.max_trials, "arms": [a.key for a in arms],
            "configurations": res.distinct, "asks": len(res.trials),
            **{f"configurations_{k}": v for k, v in counts.items()},
            "stopped_by": res.stopped_by, "search_wall_seconds": res.wall_seconds,
            "wall_seconds": wall, "phase_seconds": phases, "simulations": runner.simulations,
            "simulated_cpu_seconds": runner.sim_seconds, "workers": runner.workers,
            "backend": f"ray:{req.ray}" if req.ray else "local",
            "recommended": recommended, "notes": notes,
        }
        (tmp / "plan.json").write_text(json.dumps(meta, indent=2, default=_json_default) + "\n")
        publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if runner is not None:
            runner.close()
    return PlanResult(ranking, stats.reset_index(), sens, recommended, notes, res,
                      runner.simulations, wall, out, report)


def _json_default(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")
