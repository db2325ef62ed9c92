"""The planner's optimiser: Optuna TPE over the policies' arms, pruned by successive halving.

Fidelity is the number of steps simulated: every trial first runs a prefix of the run's
steps (at least two -- a one-step run cannot show any overlap between steps, which would
rank every asynchronous policy last), and only trials in the better half at that rung go
on to twice as many steps, up to the full run. Only full-length results are ranked.

Trials are asked in fixed-size generations and their evaluations told back in trial order,
so the sequence of trials is a function of the seed alone: the number of workers changes
how fast it runs, never what it finds, and a time budget only decides how long a prefix of
that sequence is run (``max_trials`` fixes it exactly).

The objective is steps per hour, kept comparable by two rules: a configuration that trains
more than 1% fewer tokens than ``colocated`` on the same tasks (it dropped or cut work), or
exceeds the staleness bound, or does not finish, is *rejected* -- it never ranks -- and is
told to the optimiser with a penalised value so it still learns the region is poor.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlsched.plan.evaluation import BASE, CachedRunner, Evaluation, Job
from rlsched.plan.space import Arm, enqueue_params, suggest

TOKEN_TOLERANCE = 0.01  # a config may train at most 1% fewer tokens than colocated
BATCH = 4  # trials per generation: part of what makes a seed reproducible
PATIENCE = 16  # stop once this many asks in a row brought no new configuration
BASELINE = "colocated"


@dataclass(frozen=True)
class Verdict:
    value: float  # what the optimiser is told (penalised when rejected)
    feasible: bool
    reason: str  # "" when feasible


def judge(ev: Evaluation, baseline: Evaluation, max_staleness: int) -> Verdict:
    """Feasibility and objective of one evaluation against colocated on the same tasks."""
    if ev.error:
        return Verdict(0.0, False, f"failed: {ev.error}")
    if not ev.complete:
        return Verdict(0.0, False, "did not finish")
    if ev.max_staleness > max_staleness:
        return Verdict(0.5 * ev.steps_per_hour, False, f"staleness {ev.max_staleness}")
    ratio = ev.trained_tokens / baseline.trained_tokens if baseline.trained_tokens else 1.0
    if ratio < 1.0 - TOKEN_TOLERANCE:
        return Verdict(0.5 * ratio * ev.steps_per_hour, False,
                       f"trains {100 * (1 - ratio):.1f}% fewer tokens than colocated")
    return Verdict(ev.steps_per_hour, True, "")


def rungs_for(steps: int) -> list[int]:
    """Step counts of the fidelity rungs: 2, 4, 8, ... then the full run."""
    out: list[int] = []
    n = 2
    while n < steps:
        out.append(n)
        n *= 2
    return [*out, steps]


@dataclass(frozen=True)
class TrialRecord:
    number: int
    arm: str
    spec: str
    params: dict[str, Any]
    state: str  # complete | pruned | rejected
    steps: int  # steps of its last evaluation
    value: float
    reason: str
    repeat: bool = False  # the optimiser asked for a configuration it had already seen


@dataclass
class SearchResult:
    trials: list[TrialRecord] = field(default_factory=list)
    full: dict[str, Evaluation] = field(default_factory=dict)  # spec -> full-length evaluation
    params: dict[str, dict[str, Any]] = field(default_factory=dict)  # spec -> searched values
    arm_of: dict[str, str] = field(default_factory=dict)  # spec -> arm key
    trial_of: dict[str, int] = field(default_factory=dict)  # spec -> first trial (-1: baseline)
    baselines: dict[int, Evaluation] = field(default_factory=dict)  # steps -> colocated
    wall_seconds: float = 0.0
    stopped_by: str = ""  # "trials" | "budget" | "converged"

    @property
    def counts(self) -> dict[str, int]:
        """Distinct configurations by outcome (repeats cost no simulation, so not counted)."""
        c = {"complete": 0, "pruned": 0, "rejected": 0}
        for t in self.trials:
            if not t.repeat:
                c[t.state] += 1
        return c

    @property
    def distinct(self) -> int:
        return sum(not t.repeat for t in self.trials)


SearchProgress = Callable[[int, float, str], None]  # (trials done, elapsed s, best spec)


def _quiet_optuna() -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def search(
    arms: list[Arm],
    runner: CachedRunner,
    steps: int,
    *,
    max_staleness: int,
    seed: int,
    deadline: Callable[[], float],
    max_trials: int | None = None,
    min_trials: int = 0,
    batch: int = BATCH,
    progress: SearchProgress | None = None,
) -> SearchResult:
    """Run the study until ``max_trials`` distinct configurations, ``deadline()`` (a
    ``time.monotonic()`` value, asked again before each generation: the caller re-estimates
    what its later phases need from the simulation speed measured so far), or until the
    optimiser only proposes configurations it has already seen (converged).

    A generation is started only if it is expected to end before the deadline (judged by
    the previous one's duration), except while fewer than ``min_trials`` have run. The
    first trials run each arm at its declared defaults and are never pruned.
    """
    optuna = _quiet_optuna()
    t0 = time.monotonic()
    rungs = rungs_for(steps)
    res = SearchResult()
    # Colocated at every rung: the token yardstick, the first timing, and a ranked row.
    for ev in runner.map([Job(BASE, BASELINE, n) for n in rungs]):
        res.baselines[ev.job.steps] = ev
    res.full[BASELINE] = res.baselines[steps]
    res.params[BASELINE], res.arm_of[BASELINE], res.trial_of[BASELINE] = {}, BASELINE, -1

    sampler = optuna.samplers.TPESampler(
        seed=seed, multivariate=True, group=True, constant_liar=True,
        n_startup_trials=max(10, len(arms)),
    )
    pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=rungs[0], reduction_factor=2)
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    for arm in arms:  # every arm starts from its declared defaults
        study.enqueue_trial(enqueue_params(arm))

    best_spec, best_value = BASELINE, res.baselines[steps].steps_per_hour
    seen: set[str] = set()
    since_new = 0  # asks in a row that brought no new configuration
    last_gen = 0.0
    while True:
        done = len(seen)
        if max_trials is not None and done >= max_trials:
            res.stopped_by = "trials"
            break
        if done >= min_trials and since_new >= PATIENCE:
            res.stopped_by = "converged"
            break
        if done >= min_trials and time.monotonic() + last_gen > deadline():
            res.stopped_by = "budget"
            break
        g0 = time.monotonic()
        size = batch if max_trials is None else min(batch, max_trials - done)
        gen = []
        for _ in range(size):
            trial = study.ask()
            arm, values = suggest(trial, arms)
            spec = arm.spec(values)
            repeat = spec in seen
            seen.add(spec)
            since_new = since_new + 1 if repeat else 0
            gen.append((trial, arm, values, spec, repeat))
        alive = list(range(len(gen)))
        for r, n in enumerate(rungs):
            evals = runner.map([Job(BASE, gen[i][3], n) for i in alive])
            survivors = []
            for i, ev in zip(alive, evals, strict=True):
                trial, arm, values, spec, repeat = gen[i]
                verdict = judge(ev, res.baselines[n], max_staleness)
                if r < len(rungs) - 1:
                    trial.report(verdict.value, n)
                    # each arm's defaults run in full: they anchor the ranking
                    if trial.number < len(arms) or not trial.should_prune():
                        survivors.append(i)
                        continue
                    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    state = "pruned"
                else:
                    study.tell(trial, verdict.value)
                    state = "complete" if verdict.feasible else "rejected"
                    res.full.setdefault(spec, ev)
                    res.params.setdefault(spec, values)
                    res.trial_of.setdefault(spec, trial.number)
                    res.arm_of.setdefault(spec, arm.key)
                    if verdict.feasible and verdict.value > best_value:
                        best_spec, best_value = spec, verdict.value
                res.trials.append(TrialRecord(trial.number, arm.key, spec, values, state, n,
                                              verdict.value, verdict.reason, repeat))
            alive = survivors
            if not alive:
                break
        last_gen = time.monotonic() - g0
        if progress:
            progress(len(seen), time.monotonic() - t0, best_spec)
    res.trials.sort(key=lambda t: t.number)
    res.wall_seconds = time.monotonic() - t0
    return res
