"""``rlsched plan``: search the policies' parameters on a trace and recommend a config."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import pandas as pd
import typer

from rlsched.cli.run import (
    ConfigOpt,
    CostOpt,
    GpuOpt,
    GpusOpt,
    ModelOpt,
    SamplesOpt,
    StepsOpt,
    TasksOpt,
    TpOpt,
    TraceOpt,
    read_files,
    resolve_settings,
    resolve_trace_path,
)
from rlsched.cluster.errors import ConfigError

if TYPE_CHECKING:
    from rlsched.plan import PlanResult

SHOWN = 10  # ranking rows printed; ranking.csv has them all


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_cmd)


def plan_cmd(
    out: Annotated[Path, typer.Option("--out", help="Output directory (ranking.csv, recommended.toml, ...).")],
    trace: TraceOpt = None,
    config: ConfigOpt = None,
    cost: CostOpt = None,
    model_preset: ModelOpt = None,
    gpu_preset: GpuOpt = None,
    gpus: GpusOpt = None,
    tp: TpOpt = None,
    steps: StepsOpt = None,
    tasks_per_step: TasksOpt = None,
    samples_per_task: SamplesOpt = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed of the run and the search (same seed, same trials: same result).")] = None,
    max_staleness: Annotated[int, typer.Option("--max-staleness", help="Largest staleness a configuration may have (0: on-policy only).")] = 1,
    budget_minutes: Annotated[float, typer.Option("--budget-minutes", help="Wall-clock budget for the whole plan.")] = 2.0,
    trials: Annotated[int | None, typer.Option("--trials", help="Stop the search after this many trials (the budget still applies).")] = None,
    policies: Annotated[list[str] | None, typer.Option("--policies", help="Comma-separated policy names to search (default: all registered); repeatable.")] = None,
    workers: Annotated[int, typer.Option("--workers", help="Simulator processes on this machine.")] = 2,
    ray: Annotated[str | None, typer.Option("--ray", help="Evaluate on an existing Ray cluster: 'auto' or its address ('local' starts a private one).")] = None,
    resamples: Annotated[int, typer.Option("--resamples", help="Bootstrap resamples of the trace for the robustness check.")] = 5,
    top: Annotated[int, typer.Option("--top", help="How many of the best configurations get the robustness check.")] = 3,
    flag_pct: Annotated[float, typer.Option("--flag-pct", help="Flag a winner whose worst resample is this % below the runner-up's mean.")] = 5.0,
    no_sensitivity: Annotated[bool, typer.Option("--no-sensitivity", help="Skip the cluster-size and tail sensitivity study.")] = False,
    no_report: Annotated[bool, typer.Option("--no-report", help="Skip run records and report.html for the top candidates.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty --out directory.")] = False,
) -> None:
    """Search every policy's parameters in the simulator; write a ranking and recommended.toml."""
    from rlsched.plan import PlanRequest, plan
    from rlsched.traces import load_trace
    from rlsched.traces.digest import trace_meta

    cfg, run, model = resolve_settings(
        config, cost, model_preset, gpu_preset, gpus=gpus, tp=tp, steps=steps, tasks_per_step=tasks_per_step,
        samples_per_task=samples_per_task, seed=seed,
    )
    warn_unused_policies(cfg.policies, cfg.source)
    names = search_names(policies)
    if ray is not None and not ray.strip():  # ('' ran locally without a word)
        raise ConfigError("--ray '': expected 'auto', 'local' or a Ray cluster's address")
    path = resolve_trace_path(trace, cfg)
    frame = load_trace(path)
    req = PlanRequest(
        trace_path=path, trace=frame, trace_digest=trace_meta(path), run=run, cost=model,  # type: ignore[arg-type]
        live=dict(cfg.live),
        max_staleness=max_staleness, budget_minutes=budget_minutes, max_trials=trials,
        seed=run.seed, workers=workers, ray=ray, policies=names, resamples=resamples, top=top,
        flag_pct=flag_pct, sensitivity=not no_sensitivity, report=not no_report,
        inputs=read_files(config, cost),
    )
    with _progress() as progress:
        result = plan(req, out, force=force, progress=progress)
    print_plan(result)


def search_names(policies: list[str] | None) -> tuple[str, ...] | None:
    """The policies ``--policies`` limits the search to, over every ``--policies`` given (a
    second one silently replaced the first); None: all registered."""
    if not policies:
        return None
    names: list[str] = []
    for given in policies:
        found = [n.strip() for n in given.split(",")]
        if "" in found:  # (as compare refuses it: 'colocated,,async' dropped the gap silently)
            raise ConfigError(f"--policies {given!r}: empty name in the list")
        if any(":" in n or "=" in n for n in found):
            raise ConfigError(f"--policies {given!r}: expected plain policy names, e.g. async,elastic")
        names += found
    return tuple(names)


def warn_unused_policies(specs: tuple[str, ...], source: str) -> None:
    """One stderr line when the config lists ``[[policy]]`` entries: plan searches every
    policy's parameters itself, and the entries were ignored without a word (a config
    written for ``compare``, or a ``recommended.toml`` planned again, still plans)."""
    if specs:
        typer.echo(f"rlsched: warning: {source}: plan does not use its [[policy]] entries "
                   f"({', '.join(specs[:3])}{', ...' if len(specs) > 3 else ''}); it searches every "
                   "policy's parameters -- --policies NAMES limits the search", err=True)


@contextmanager
def _progress() -> Iterator:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from rlsched.ui import console_err

    bar = Progress(
        TextColumn("{task.description:<12}"), BarColumn(), TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(), console=console_err(), transient=False,
        disable=not console_err().is_terminal,
    )
    tasks: dict[str, int] = {}

    def update(phase: str, done: float, total: float, note: str) -> None:
        if phase not in tasks:
            tasks[phase] = bar.add_task(phase, total=total, note=note)
        bar.update(tasks[phase], completed=done, total=total, note=note[:60])

    with bar:
        yield update


def _num(v: object, fmt: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return format(v, fmt)


def print_plan(result: PlanResult) -> None:
    from rich.console import Console
    from rich.table import Table

    from rlsched.ui import console_err

    con = Console() if Console().is_terminal else Console(width=170)
    r: pd.DataFrame = result.ranking
    same = r["note"].fillna("").str.startswith("same schedule as")
    shown = r[~same | r["recommended"]].head(SHOWN)
    if not (shown["policy"] == "colocated").any():  # the yardstick, always on screen
        shown = pd.concat([shown, r[r["policy"] == "colocated"]])
    table = Table(title=f"plan: ranked configurations ({len(shown)} best distinct schedules of "
                        f"{len(r)} configurations; all in ranking.csv)")
    for c in ("#", "policy", "steps/h", "mean", "std", "min", "util", "stale", "gap %", "note"):
        wrap = c in ("policy", "note")
        table.add_column(c, justify="left" if wrap else "right", overflow="fold" if wrap else "ellipsis",
                         no_wrap=not wrap, ratio=3 if c == "policy" else (2 if wrap else None))
    twins = r.loc[same, "note"].str.extract(r"#(\d+)")[0].astype(int).value_counts()
    for _, row in shown.iterrows():
        n_same = int(twins.get(int(row["rank"]), 0))
        note = "; ".join(x for x in ("RECOMMENDED" if row["recommended"] else "",
                                     row["flagged"] or "", row["note"] or "",
                                     f"{n_same} more with this schedule" if n_same else "") if x)
        table.add_row(str(row["rank"]), str(row["policy"]), f"{row['steps_per_hour']:.3f}",
                      _num(row["sph_mean"], ".3f"), _num(row["sph_std"], ".3f"),
                      _num(row["sph_min"], ".3f"), f"{row['utilization']:.3f}",
                      str(row["max_staleness"]), _num(row["gap_to_bound_pct"], ".1f"), note)
    con.print(table)
    if len(result.sensitivity):
        s = Table(title="sensitivity: does the best choice change?")
        for c in ("scenario", "gpus", "best there", "steps/h", "recommended", "its rank", "colocated", "change"):
            wrap = c in ("scenario", "best there")
            s.add_column(c, justify="left" if wrap or c == "change" else "right",
                         overflow="fold" if wrap else "ellipsis", no_wrap=not wrap)
        for _, row in result.sensitivity.iterrows():
            s.add_row(str(row["scenario"]), str(row["gpus"]), str(row.get("best", "")),
                      _num(row.get("best_steps_per_hour"), ".3f"),
                      _num(row.get("recommended_steps_per_hour"), ".3f"),
                      _num(row.get("recommended_rank"), ".0f"),
                      _num(row.get("colocated_steps_per_hour"), ".3f"), str(row["change"]))
        con.print(s)
    err = console_err()
    for note in result.notes:
        err.print(f"note: {note}")
    c = result.search.counts
    err.print(
        f"search: {result.search.distinct} configurations ({c['complete']} full-length, {c['pruned']} "
        f"pruned, {c['rejected']} rejected; {len(result.search.trials)} asks, stopped by "
        f"{result.search.stopped_by}) in {result.search.wall_seconds:.0f}s; "
        f"{result.simulations} simulations, {result.wall_seconds:.0f}s in all"
    )
    out = result.out
    con.print(f"recommended: {result.recommended}")
    con.print(f"wrote {out / 'ranking.csv'}, {out / 'sensitivity.csv'}, {out / 'recommended.toml'}"
              + (f", {result.report}" if result.report else ""))
    con.print(f"next: rlsched compare --config {out / 'recommended.toml'} --out <DIR>")
