"""``rlsched report RUN_DIR [RUN_DIR...] [--out DIR] [--open]``: the HTML report of run records.

Without ``--out`` the report goes next to what it describes: into ``RUN/report`` when one
folder is given (a run directory, or a ``compare``/``run`` output folder standing for its
runs), into ``./rlsched-report`` (in the current directory) when several are."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

MANY_RUNS_DEFAULT = Path("rlsched-report")


def register(app: typer.Typer) -> None:
    app.command("report")(report_cmd)


def report_cmd(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run directories (written by `rlsched run` or `compare`, under runs/), or a compare output folder for all its runs.", show_default=False)],
    out: Annotated[Path | None, typer.Option(
        "--out", help="Folder for report.html and the CSV tables. Default: RUN/report for one folder given, "
                      f"./{MANY_RUNS_DEFAULT} (in the current directory) for several.",
        show_default=False)] = None,
    title: Annotated[str | None, typer.Option("--title", help="Page title.")] = None,
    open_report: Annotated[bool, typer.Option("--open", help="Open report.html in a browser.")] = False,
) -> None:
    """Write DIR/report.html (self-contained: plots embedded) and summary/breakdown/bubbles/staleness CSVs."""
    from rlsched.analysis.report import write_report

    dirs = _expand(run_dirs)
    warn_if_setups_differ(dirs)
    path = write_report(dirs, default_out(run_dirs) if out is None else out, title=title)
    typer.echo(f"report: {path}")
    if open_report:
        import webbrowser

        webbrowser.open(path.absolute().as_uri())


def warn_if_setups_differ(dirs: list[Path]) -> None:
    """One stderr line when the runs did not replay the same trace on the same cluster and
    cost model (their report would compare setups, not just policies), or a trace file has
    changed since a run replayed it (even for one run: the page's trace statistics are of
    the file now); said before the report is built, so it is seen even if that takes a
    while."""
    from rlsched.analysis.comparable import setup_warning
    from rlsched.analysis.load import check_meta
    from rlsched.cluster.record import read_run

    heads = [read_run(d, tables=()) for d in dirs]  # (a bad folder: its one error line)
    for h in heads:  # (an impossible field: its one error line, before any warning)
        check_meta(h.meta, h.path / "meta.json")
    warning = setup_warning([(h.path, h.meta) for h in heads])
    if warning:
        typer.echo(f"rlsched: warning: {warning}", err=True)


def default_out(run_dirs: list[Path]) -> Path:
    """Where the report goes without ``--out`` (see the module doc)."""
    return run_dirs[0] / "report" if len(run_dirs) == 1 else MANY_RUNS_DEFAULT


def _expand(run_dirs: list[Path]) -> list[Path]:
    """A `rlsched compare` output folder stands for all the runs under its ``runs/``.

    A run reached twice (named twice, or both itself and through its output folder) is
    refused: it was reported as two runs, ``#2``/``#3`` of one label, tied in every table."""
    from rlsched.cluster.record import runs_in

    out: list[Path] = []
    given: dict[Path, Path] = {}  # resolved run folder -> the argument that reached it
    for d in run_dirs:
        found = runs_in(d)
        if not found and not (d / "meta.json").exists() and (d / "runs").is_dir():
            # (a compare folder whose runs are all incomplete: name them, not the folder,
            # which was blamed for a meta.json it never has)
            found = sorted(p for p in (d / "runs").iterdir() if p.is_dir())
        for run in found or [d]:
            _refuse_twice(run, d, given)
        out.extend(found or [d])
    return out


def _refuse_twice(run: Path, arg: Path, given: dict[Path, Path]) -> None:
    """Record that argument ``arg`` reached ``run``; one :class:`ConfigError` line if an
    earlier argument reached the same folder."""
    from rlsched.cluster.errors import ConfigError

    key = run.resolve()
    first = given.setdefault(key, arg)
    if first is arg:
        return
    def reach(a: Path) -> str:
        return f"as {a}" if a.resolve() == key else f"through {a}"

    raise ConfigError(f"{run}: the same run given twice ({reach(first)}, then {reach(arg)}): "
                      "expected each run once")
