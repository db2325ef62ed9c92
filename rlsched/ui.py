"""Terminal output: progress bars and summary tables (stderr for chatter, stdout for results)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import pandas as pd
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


@cache
def console_err() -> Console:
    return Console(stderr=True)


def console_out() -> Console:
    """stdout console; off a terminal (files, CI logs) wide enough not to squeeze tables."""
    out = Console()
    return out if out.is_terminal else Console(width=200)


def print_rows(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A table on stdout: a rich table on a terminal; elsewhere (a pipe, a file) plain
    aligned columns, each row one whole line, so ``| grep``/``| cut`` see every name and
    help text (rich squeezes and wraps a table to 80 columns off a terminal)."""
    out = Console()
    if out.is_terminal:
        table = Table(title=title)
        for c in columns:
            table.add_column(c)
        for row in rows:
            table.add_row(*row)
        out.print(table)
        return
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    for line in (columns, *rows):
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())


PROGRESS_SECONDS_ENV = "RLSCHED_PROGRESS_SECONDS"
PROGRESS_SECONDS = 10.0  # off a terminal: at most one line per policy this often


def progress_interval() -> float:
    """Seconds between plain progress lines off a terminal (``RLSCHED_PROGRESS_SECONDS``;
    0 prints every step)."""
    raw = os.environ.get(PROGRESS_SECONDS_ENV, "")
    try:
        return max(0.0, float(raw)) if raw else PROGRESS_SECONDS
    except ValueError:
        return PROGRESS_SECONDS


@contextmanager
def step_progress(specs: Sequence[str], steps: int) -> Iterator:
    """Yield a ``(policy, done, total, sim_time)`` callback: one bar per policy on a
    terminal; elsewhere (CI logs, ``nohup``, a pipe) a plain stderr line per policy at most
    every :func:`progress_interval` seconds and at its last step, so a seed-scale replay
    that runs for minutes still shows where it is."""
    if not console_err().is_terminal:
        every, t0 = progress_interval(), time.monotonic()
        last: dict[str, float] = {}

        def line(spec: str, done: int, total: int, now: float) -> None:
            wall = time.monotonic()
            if done < total and wall - last.get(spec, t0) < every:
                return
            last[spec] = wall
            print(f"{spec}: step {done}/{total}  sim t={now:,.0f}s  wall {wall - t0:,.1f}s",
                  file=console_err().file, flush=True)

        yield line
        return
    progress = Progress(
        TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("steps  sim t={task.fields[now]:>9.0f}s"), TimeElapsedColumn(),
        console=console_err(), transient=False,
    )
    tasks = {s: progress.add_task(s[:40], total=steps, now=0.0) for s in specs}

    def update(spec: str, done: int, total: int, now: float) -> None:
        progress.update(tasks[spec], completed=done, now=now)

    with progress:
        yield update


def print_summary(summary: pd.DataFrame, out: Path | None = None) -> None:
    """The summary table on stdout; then, on stderr, one warning per policy that trained no
    tokens, saying why from its run's trajectories (``out``: the folder whose ``run_dir``
    paths the summary gives; without it, or unreadable, the warning names where to look)."""
    table = Table(title="policy comparison (simulated)")
    cols = [c for c in ("policy", "steps", "sim_seconds", "steps_per_hour", "lower_bound_seconds",
                        "gpu_utilization", "trained_tokens", "max_staleness", "lost_trajectories")
            if c in summary.columns]
    for c in cols:
        table.add_column(c, justify="left" if c == "policy" else "right")
    for _, row in summary.iterrows():
        cells = []
        for c in cols:
            v = row[c]
            if isinstance(v, float):
                cells.append(f"{v:.3f}" if c == "gpu_utilization" else f"{v:,.1f}")
            elif isinstance(v, int):
                cells.append(f"{v:,}")
            else:
                cells.append(str(v))
        table.add_row(*cells)
    console_out().print(table)
    if "trained_tokens" in summary.columns:
        for _, row in summary[summary["trained_tokens"] == 0].iterrows():
            # (a run that trained nothing is no comparison: said, not left to the table --
            # every trajectory of a trace whose contexts exceed an engine's KV ends timed out)
            reason = _no_tokens_reason(out, row.get("run_dir"))
            typer.echo(f"warning: {row['policy']} trained no tokens: {reason}", err=True)


def _no_tokens_reason(out: Path | None, run_dir: object) -> str:
    """:func:`rlsched.analysis.metrics.no_tokens_reason` of the run at ``out/run_dir``."""
    from rlsched.analysis.metrics import no_tokens_reason

    cols = ["status", "finish_status", "turns_done", "prompt_tokens", "output_tokens"]
    if out is not None and isinstance(run_dir, str) and run_dir:
        try:
            trajectories = pd.read_parquet(out / run_dir / "trajectories.parquet", columns=cols)
        except (OSError, ValueError, KeyError):  # (unreadable: only this warning's detail is lost)
            pass
        else:
            return no_tokens_reason(trajectories)
    return "see status, finish_status and the token columns in its run's trajectories.parquet"
