"""The planner's second opinions on the search's winners (phases 2 and 3 of ``rlsched plan``).

**Robustness**: the best few distinct configurations are replayed on bootstrap resamples
of the trace's tasks; a mean winner whose worst resample falls more than ``flag_pct`` below
the runner-up's mean is flagged, and the runner-up is recommended instead -- a schedule
that wins on average but collapses on some draws of tasks is a poor bet for a long run.

**Sensitivity**: the recommended arm's two best settings and every other arm's best are
replayed at half and twice the GPUs and with the longest trajectories removed or doubled,
to say whether the choice would change with the cluster or the tail.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pandas as pd

from rlsched.cluster.errors import ConfigError
from rlsched.plan.evaluation import CachedRunner, Evaluation, Job, PlanSetup, Scenario
from rlsched.plan.request import PlanRequest
from rlsched.plan.search import BASELINE, SearchResult, judge

PlanProgress = Callable[[str, float, float, str], None]  # (phase, done, total, note)


def distinct_best(specs: list[tuple[str, Evaluation]], n: int) -> list[str]:
    """The first ``n`` specs whose outcomes differ (rounding often makes two specs run the
    same schedule: a rollout share of 0.50 or 0.52 is the same number of engines)."""
    out, seen = [], set()
    for spec, ev in specs:
        key = (round(ev.makespan, 6), ev.trained_tokens)
        if key not in seen:
            seen.add(key)
            out.append(spec)
        if len(out) == n:
            break
    return out


def feasible_sorted(res: SearchResult, max_staleness: int, steps: int) -> list[tuple[str, Evaluation]]:
    base = res.baselines[steps]
    ok = [(s, ev) for s, ev in res.full.items() if judge(ev, base, max_staleness).feasible]
    # Ties are common (many settings give one schedule): prefer the one found first, which
    # puts a policy's declared defaults ahead of the optimiser's arbitrary equivalents.
    return sorted(ok, key=lambda x: (-x[1].steps_per_hour, res.trial_of[x[0]]))


def robustness(req: PlanRequest, runner: CachedRunner, cands: list[str], steps: int,
                progress: PlanProgress | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    scenarios = [Scenario(f"boot-{i}", "bootstrap", seed=req.seed * 1000 + i)
                 for i in range(req.resamples)]
    specs = list(dict.fromkeys([*cands, BASELINE]))
    jobs = [Job(sc, s, steps) for sc in scenarios for s in specs]
    done = [0]

    def tick(_: Evaluation) -> None:
        done[0] += 1
        if progress:
            progress("robustness", done[0], len(jobs), "")

    evals = {(ev.job.scenario.name, ev.job.spec): ev for ev in runner.map(jobs, tick)}
    rows = []
    for sc in scenarios:
        base = evals[(sc.name, BASELINE)]
        for s in specs:
            ev = evals[(sc.name, s)]
            v = judge(ev, base, req.max_staleness)
            rows.append({"policy": s, "resample": sc.name, "seed": sc.seed,
                         "steps_per_hour": ev.steps_per_hour, "feasible": v.feasible,
                         "note": v.reason})
    detail = pd.DataFrame(rows)
    stats = []
    for s in specs:
        x = detail.loc[detail["policy"] == s, "steps_per_hour"].to_numpy(dtype=float)
        stats.append({"policy": s, "sph_mean": float(x.mean()),
                      "sph_std": float(x.std(ddof=1)) if len(x) > 1 else 0.0,
                      "sph_min": float(x.min()), "resamples": len(x),
                      "infeasible": int((~detail.loc[detail["policy"] == s, "feasible"]).sum())})
    return pd.DataFrame(stats).set_index("policy"), detail


def choose(stats: pd.DataFrame, cands: list[str], flag_pct: float) -> tuple[str, dict[str, str], list[str]]:
    """Order candidates by bootstrap mean; flag a mean winner that loses badly somewhere."""
    order = sorted(cands, key=lambda s: (-stats.loc[s, "sph_mean"], s))
    flags: dict[str, str] = {}
    notes: list[str] = []
    for s in order:
        if stats.loc[s, "infeasible"]:
            flags[s] = f"rejected on {int(stats.loc[s, 'infeasible'])} resample(s)"
    winner = order[0]
    if len(order) > 1:
        runner_up = order[1]
        floor = stats.loc[runner_up, "sph_mean"] * (1 - flag_pct / 100)
        if stats.loc[winner, "sph_min"] < floor:
            flags[winner] = (f"worst resample {stats.loc[winner, 'sph_min']:.3f} steps/h is more than "
                             f"{flag_pct:g}% below the runner-up's mean "
                             f"{stats.loc[runner_up, 'sph_mean']:.3f}")
    pick = next((s for s in order if s not in flags), order[0])
    if pick != winner:
        notes.append(f"{winner} has the best mean but is flagged ({flags[winner]}); recommending {pick}")
    return pick, flags, notes


#: ``sensitivity.csv``'s columns, in order, whichever scenarios ran or were skipped (a
#: skipped first scenario moved ``change`` ahead of the figures), and with none at all.
SENSITIVITY_COLUMNS = ("scenario", "gpus", "best", "best_steps_per_hour", "recommended_steps_per_hour",
                       "recommended_rank", "colocated_steps_per_hour", "candidates", "change")
#: ``sensitivity_detail.csv``'s columns: one row per scenario and candidate.
SENSITIVITY_DETAIL_COLUMNS = ("scenario", "gpus", "policy", "steps_per_hour", "feasible", "note")


def sensitivity_frames(rows: list[dict], detail: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The two sensitivity tables with their fixed columns: ``plan --no-sensitivity``
    wrote files holding a blank line and no header, which CSV readers refuse ("No columns
    to parse from file"); a skipped scenario's row has no figures, and its missing
    ``candidates`` turned the others' counts into floats (3.0)."""
    sens = pd.DataFrame(rows, columns=list(SENSITIVITY_COLUMNS))
    sens["candidates"] = sens["candidates"].astype("Int64")
    return sens, pd.DataFrame(detail, columns=list(SENSITIVITY_DETAIL_COLUMNS))


def sensitivity(req: PlanRequest, runner: CachedRunner, res: SearchResult, setup: PlanSetup,
                 recommended: str, progress: PlanProgress | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    run = setup.run
    feasible = feasible_sorted(res, req.max_staleness, run.steps)
    cands: list[str] = []
    for arm in dict.fromkeys(res.arm_of[s] for s, _ in feasible):
        # the recommended arm's two best settings (do its parameters move?), one of the others
        n = 2 if arm == res.arm_of[recommended] else 1
        cands += distinct_best([(s, ev) for s, ev in feasible if res.arm_of[s] == arm], n)
    cands = list(dict.fromkeys([recommended, *cands, BASELINE]))
    pct = f"{setup.tail_fraction:.0%}"
    scenarios: list[tuple[Scenario, str]] = []
    for factor, label in ((0.5, "0.5x GPUs"), (2.0, "2x GPUs")):
        gpus = int(run.gpus * factor)
        try:
            replace(run, gpus=gpus)
        except ConfigError as err:
            scenarios.append((Scenario(f"gpus-{gpus}", "skip", gpus), f"{label}: skipped ({err})"))
            continue
        floor = _trainer_floor(setup)
        if gpus < floor:  # (it failed the whole plan with "use --gpus >= N" about a cluster not given)
            scenarios.append((Scenario(f"gpus-{gpus}", "skip", gpus),
                              f"{label}: skipped (the cost model's trainer needs at least {floor} GPUs)"))
            continue
        scenarios.append((Scenario(f"gpus-{gpus}", "base", gpus), label))
    cut_label = f"{pct} longest trajectories removed"
    if setup.trace["trajectory_id"].nunique() > 1:
        scenarios.append((Scenario("tail-cut", "tail-cut"), cut_label))
    else:  # the cut takes at least one trajectory: here, all of them
        scenarios.append((Scenario("tail-cut", "skip", run.gpus),
                          f"{cut_label}: skipped (the trace has one trajectory)"))
    scenarios.append((Scenario("tail-x2", "tail-x2"), f"{pct} longest trajectories doubled"))
    live = [sc for sc, _ in scenarios if sc.kind != "skip"]
    jobs = [Job(sc, s, run.steps) for sc in live for s in cands]
    done = [0]

    def tick(_: Evaluation) -> None:
        done[0] += 1
        if progress:
            progress("sensitivity", done[0], len(jobs), "")

    evals = {(ev.job.scenario.name, ev.job.spec): ev for ev in runner.map(jobs, tick)}
    rows, detail = [], []
    for sc, label in scenarios:
        if sc.kind == "skip":
            rows.append({"scenario": label, "gpus": sc.gpus, "best": "", "change": "skipped"})
            continue
        base = evals[(sc.name, BASELINE)]
        ranked = []
        for s in cands:
            ev = evals[(sc.name, s)]
            v = judge(ev, base, req.max_staleness)
            detail.append({"scenario": label, "gpus": ev.gpus, "policy": s,
                           "steps_per_hour": ev.steps_per_hour, "feasible": v.feasible,
                           "note": v.reason})
            if v.feasible:
                ranked.append((ev.steps_per_hour, s))
        ranked.sort(key=lambda x: (-x[0], x[1]))
        order = [s for _, s in ranked]
        best = order[0] if order else ""
        change = ("none" if best == recommended else
                  "parameters" if best and res.arm_of.get(best) == res.arm_of.get(recommended) else
                  "policy")
        rows.append({
            "scenario": label, "gpus": evals[(sc.name, BASELINE)].gpus, "best": best,
            "best_steps_per_hour": ranked[0][0] if ranked else math.nan,
            "recommended_steps_per_hour": evals[(sc.name, recommended)].steps_per_hour,
            "recommended_rank": order.index(recommended) + 1 if recommended in order else math.nan,
            "colocated_steps_per_hour": base.steps_per_hour,
            "candidates": len(cands), "change": change,
        })
    return sensitivity_frames(rows, detail)


def _trainer_floor(setup: PlanSetup) -> int:
    """The fewest GPUs the cost model's trainer fits on (1 without a memory model)."""
    from rlsched.sim.memory import train_layout

    layout = train_layout(setup.cost)
    return layout.min_gpus if layout.memory is not None else 1
