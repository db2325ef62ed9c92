"""``rlsched trace import``: turn agent logs (SWE-agent ``.traj``, chat-transcript JSONL,
OpenHands evaluation output, mini-swe-agent trajectories, verl rollout dumps) into a trace
file.

Attached to the ``rlsched trace`` group by :func:`register` (called from ``rlsched/cli/__init__.py``).
Bad input files are skipped and listed in the summary; if every input is bad the import
fails with one line (a ``TraceError``, printed by :mod:`rlsched.cli`) and writes nothing.
Also holds :func:`fit_report_table`, the table ``trace gen --like`` prints.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer
from rich.table import Table

from rlsched.cluster.errors import ConfigError
from rlsched.traces import write_trace
from rlsched.traces.envtime import MODEL_NAME
from rlsched.traces.importers import IMPORTERS, ImportResult, get_importer, import_traces
from rlsched.traces.load import check_trace_out

#: At most this many skip reasons are printed; the count is always complete.
MAX_SKIPS_SHOWN = 20


def summary_lines(result: ImportResult, out: Path | None = None) -> list[str]:
    """The human summary of an import: counts, skips with reasons, how tokens/time were got."""
    df = result.df
    lines = [f"imported {result.imported} trajectories ({len(df)} turns, "
             f"{df['task_id'].nunique()} tasks) from {result.files} file(s); "
             f"skipped {len(result.skipped)}" + (":" if result.skipped else "")]
    for where, reason in result.skipped[:MAX_SKIPS_SHOWN]:
        lines.append(f"  skipped {where}: {reason}")
    if len(result.skipped) > MAX_SKIPS_SHOWN:
        lines.append(f"  ... and {len(result.skipped) - MAX_SKIPS_SHOWN} more")
    hint = " (pass --tokenizer DIR for exact counts)" if result.token_source.startswith(
        "estimate") else ""
    if result.token_recorded == len(df):
        lines.append(f"tokens: the model API's recorded usage on all {len(df)} turns")
    elif result.token_recorded:
        lines.append(f"tokens: the model API's recorded usage on {result.token_recorded} of "
                     f"{len(df)} turns, the rest counted with {result.token_source} (column "
                     f"token_source){hint}")
    else:
        lines.append(f"tokens counted with {result.token_source}{hint}")
    truncated = int(df.loc[df["truncated"], "trajectory_id"].nunique())
    lines.append(f"env time estimated on {result.env_estimated} of {len(df)} turns "
                 f"(column env_estimated; model: {MODEL_NAME}); truncated trajectories: "
                 f"{truncated}")
    lines.extend(result.notes)
    if out is not None:
        lines.append(f"wrote {out}")
    return lines


def fit_report_table(report: pd.DataFrame, title: str = "fit") -> Table:
    """A rich table of :func:`~rlsched.traces.fit.fit_trace`'s report (or of
    ``compare_distributions``)."""
    table = Table(title=title)
    table.add_column(report.index.name or "distribution")
    for col in report.columns:
        table.add_column(str(col), justify="left" if col in ("family", "params", "note")
                         else "right")
    for name, row in report.iterrows():
        cells = []
        for col, value in row.items():
            if isinstance(value, float):
                cells.append("" if value != value else (f"{value:.3g}" if col in (
                    "ks_stat", "p_value", "zero_frac") else f"{value:,.6g}"))
            else:
                cells.append(str(value))
        table.add_row(str(name), *cells)
    return table


def register(trace_app: typer.Typer) -> None:
    """Add ``import`` to the ``rlsched trace`` group (once: a second call does nothing)."""
    if any(c.name == "import" for c in trace_app.registered_commands):
        return

    @trace_app.command("import")
    def import_(
        paths: Annotated[list[Path], typer.Argument(
            help="Log files, or directories to search for them.", show_default=False)],
        fmt: Annotated[str, typer.Option(
            "--format", "-f", help=f"Log format: {', '.join(IMPORTERS)}.")],
        out: Annotated[Path, typer.Option(
            "--out", "-o", help="Trace file to write (.parquet or .jsonl).")],
        tokenizer: Annotated[Path | None, typer.Option(
            "--tokenizer", help="Local Hugging Face tokenizer directory (with "
            "tokenizer.json) for exact token counts; default: ~4 characters per token.")]
        = None,
    ) -> None:
        """Import agent logs (SWE-agent, chat transcripts, OpenHands, mini-swe-agent, verl) as
        a trace."""
        check_trace_out(out)
        _refuse_overwriting_a_log(out, paths, get_importer(fmt).suffixes)
        result = import_traces(fmt, paths, tokenizer=tokenizer)
        path = write_trace(result.df, out)
        for line in summary_lines(result, path):
            typer.echo(line)


def _refuse_overwriting_a_log(out: Path, paths: list[Path], suffixes: tuple[str, ...] = ()) -> None:
    """``--out`` naming one of the logs given (``-o run.jsonl run.jsonl``) replaced that log
    with the trace, silently: refused before anything is read. So is an ``--out`` that is
    a log the import finds in a folder given (``-o logs/a.jsonl logs/``: a file under the
    folder with one of the format's ``suffixes``), which was read, then overwritten."""
    real = os.path.realpath(out)
    for given in paths:
        if os.path.realpath(given) == real:
            raise ConfigError(f"--out {out}: is the log {given} being imported, which writing the "
                              "trace would overwrite; give another file name")
    if not (out.is_file() and out.suffix.lower() in suffixes):
        return
    for given in paths:
        folder = os.path.realpath(given)
        if os.path.isdir(folder) and os.path.commonpath([folder, real]) == folder:
            raise ConfigError(f"--out {out}: is a log under {given} being imported, which writing "
                              "the trace would overwrite; give a file name outside that folder")
