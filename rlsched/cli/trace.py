"""``rlsched trace gen|inspect|validate``: make, summarise and check trace files.

Errors (bad file, unknown preset, bad value) are raised as ``RlschedError`` and turned into
one line and exit code 2 by :mod:`rlsched.cli`; nothing here catches them.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rlsched.cluster.errors import ConfigError
from rlsched.traces import (
    PRESETS,
    generate_trace,
    load_trace,
    sample_trace_path,
    trace_stats,
    write_trace,
)

trace_app = typer.Typer(
    help="Make, inspect and validate rollout traces (one row per agent turn).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)

#: Above this many trajectories, ``gen`` shows a progress spinner on stderr.
_BIG = 4096


def _counts(df) -> str:
    return (f"{len(df)} rows, {df['trajectory_id'].nunique()} trajectories, "
            f"{df['task_id'].nunique()} tasks")


@trace_app.command("gen")
def gen(
    out: Annotated[Path, typer.Option("--out", help="File to write (.parquet or .jsonl).")],
    preset: Annotated[str, typer.Option(
        "--preset", help=f"Generator preset: {', '.join(PRESETS)}.")] = "longtail-small",
    seed: Annotated[int, typer.Option("--seed", help="Random seed (same seed, same trace).")]
    = 0,
    tasks: Annotated[int | None, typer.Option(
        "--tasks", help="Override the number of tasks (groups).")] = None,
    samples: Annotated[int | None, typer.Option(
        "--samples", help="Override the samples per task (group size n).")] = None,
    turns_scale: Annotated[float | None, typer.Option(
        "--turns-scale", help="Multiply turns per trajectory by this.")] = None,
    tokens_scale: Annotated[float | None, typer.Option(
        "--tokens-scale", help="Multiply all token counts by this.")] = None,
    growth: Annotated[float | None, typer.Option(
        "--growth", help="Episodes grow over the run: the last task's turns are this many "
        "times the first's, rising linearly in file order (1: no drift; preset "
        "longtail-growing: 3).")] = None,
    like: Annotated[Path | None, typer.Option(
        "--like", help="Fit the generator to this trace (e.g. an imported one) instead of a "
        "preset; --tasks/--samples scale it up.")] = None,
) -> None:
    """Generate a long-tailed synthetic trace from a preset (see traces/SOURCES.md)."""
    from rlsched.traces.load import check_trace_out

    check_trace_out(out)
    if seed < 0:  # (was "generate_trace: seed=-1" or "fit_trace: seed=-1": no such flag)
        raise ConfigError(f"--seed={seed}: expected a whole number >= 0")
    if like is not None:
        ignored = [flag for flag, value in (("--turns-scale", turns_scale),
                                            ("--tokens-scale", tokens_scale),
                                            ("--growth", growth)) if value is not None]
        if ignored:
            raise ConfigError(f"{ignored[0]} does not apply with --like (the lengths come from "
                              f"the fitted trace): drop one of them")
        if os.path.realpath(out) == os.path.realpath(like):
            # (as trace import refuses an --out that is one of its logs: the trace fitted to
            # was silently replaced by the synthetic one)
            raise ConfigError(f"--out {out}: is the --like trace {like}, which writing the "
                              "generated trace would overwrite; give another file name")
        _gen_like(like, out, seed, tasks, samples)
        return
    _check_gen_flags(tasks, samples, turns_scale, tokens_scale, growth)
    overrides: dict[str, float] = {}
    for key, value in (("tasks", tasks), ("samples", samples), ("turns_scale", turns_scale),
                       ("tokens_scale", tokens_scale), ("growth", growth)):
        if value is not None:
            overrides[key] = value
    params = PRESETS.get(preset)
    n_traj = ((overrides.get("tasks") or (params.tasks if params else 0))
              * (overrides.get("samples") or (params.samples if params else 0)))
    err = Console(stderr=True)
    t0 = time.perf_counter()
    if n_traj > _BIG:
        with err.status(f"generating {n_traj:,} trajectories ({preset}, seed {seed})..."):
            df = _generate(preset, seed, overrides)
        with err.status(f"validating and writing {len(df):,} rows to {out}..."):
            path = write_trace(df, out)
    else:
        df = _generate(preset, seed, overrides)
        path = write_trace(df, out)
    seconds = time.perf_counter() - t0
    stats = trace_stats(df)
    turns = stats.loc["turns_per_trajectory"]
    ctx = stats.loc["context_tokens_per_trajectory"]
    size = path.stat().st_size
    typer.echo(f"wrote {path} ({size / 1e6:.2f} MB) in {seconds:.1f} s: {_counts(df)}; "
               f"turns p50 {turns['p50']:.0f} max {turns['max']:.0f}; "
               f"context max {ctx['max']:,.0f} tokens")


#: ``trace gen``'s flags that set a generator parameter (``GenParams`` field -> flag).
_GEN_FLAGS = {"tasks": "--tasks", "samples": "--samples", "turns_scale": "--turns-scale",
              "tokens_scale": "--tokens-scale", "growth": "--growth"}


def _generate(preset: str, seed: int, overrides: dict[str, float]):  # -> pd.DataFrame
    """``generate_trace``, its refusal of a flag's value naming the flag: a check that
    needs the drawn values (``--tokens-scale 1e300``: token counts past 2**62) cannot run
    before it, and named ``GenParams.tokens_scale``, which ``--help`` never shows."""
    from rlsched.traces.presets import GenParamError

    try:
        return generate_trace(preset, seed=seed, **overrides)
    except GenParamError as exc:
        if exc.field not in _GEN_FLAGS or exc.field not in overrides:
            raise
        raise ConfigError(f"{_GEN_FLAGS[exc.field]}={exc.value!r}: {exc.why}") from None


def _check_gen_flags(tasks: int | None, samples: int | None, turns_scale: float | None,
                     tokens_scale: float | None, growth: float | None) -> None:
    """Refuse a bad ``trace gen`` flag naming the flag the user typed: the generator's own
    check named its parameter record (``GenParams.tasks=0``, ``GenParams.turns_scale=nan``),
    a name that appears nowhere in ``--help``."""
    for flag, count in (("--tasks", tasks), ("--samples", samples)):
        if count is not None and count < 1:
            raise ConfigError(f"{flag}={count}: expected a whole number >= 1")
    for flag, scale in (("--turns-scale", turns_scale), ("--tokens-scale", tokens_scale),
                        ("--growth", growth)):
        if scale is not None and not (math.isfinite(scale) and scale > 0):
            raise ConfigError(f"{flag}={scale}: expected a finite number > 0")


def _gen_like(like: Path, out: Path, seed: int, tasks: int | None, samples: int | None) -> None:
    """Fit length distributions of ``like`` (scipy.stats) and sample a larger trace."""
    from rlsched.cli.trace_import import fit_report_table
    from rlsched.traces.fit import compare_distributions, fit_trace
    from rlsched.traces.presets import check_trajectory_count

    tasks, samples = 64 if tasks is None else tasks, 8 if samples is None else samples
    for flag, value in (("--tasks", tasks), ("--samples", samples)):
        if value < 1:
            raise ConfigError(f"{flag}={value}: expected a whole number >= 1")
    check_trajectory_count(tasks, samples)
    real = load_trace(like)
    model, report = fit_trace(real, seed=seed)
    df = model.generate(seed=seed, tasks=tasks, samples=samples)
    path = write_trace(df, out)
    from rlsched.ui import console_out

    console = console_out()
    console.print(fit_report_table(report, f"fit to {like.name}"))
    console.print(fit_report_table(compare_distributions(real, df), "generated vs. real (two-sample KS)"))
    typer.echo(f"wrote {path}: {_counts(df)}")


def _fmt(metric: str, column: str, value: float) -> str:
    if value != value:  # NaN
        return ""
    if "seconds" in metric and column != "count":
        return f"{value:,.1f}"
    return f"{value:,.0f}" if abs(value - round(value)) < 1e-9 or value >= 100 else f"{value:,.1f}"


@trace_app.command("inspect")
def inspect(
    path: Annotated[Path | None, typer.Argument(
        help="Trace file; default: the shipped sample traces/data/longtail-small.parquet.")]
    = None,
) -> None:
    """Print percentiles of turns, tokens and env time, and counts, as a table."""
    path = path or sample_trace_path()
    df = load_trace(path)
    stats = trace_stats(df)
    table = Table(title=f"{path}: {_counts(df)}")
    table.add_column("metric")
    for col in stats.columns:
        table.add_column(col, justify="right")
    for metric, row in stats.iterrows():
        table.add_row(str(metric), *(_fmt(str(metric), str(col), float(v))
                                     for col, v in row.items()))
    Console(width=max(100, Console().width)).print(table)


@trace_app.command("validate")
def validate(
    path: Annotated[Path | None, typer.Argument(
        help="Trace file; default: the shipped sample.")] = None,
) -> None:
    """Check a trace against the schema; print OK and its size, or the first problem."""
    path = path or sample_trace_path()
    df = load_trace(path)
    typer.echo(f"OK: {_counts(df)}")
