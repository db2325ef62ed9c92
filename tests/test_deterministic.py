"""Two identical replays write identical files (issue 27): summary.csv, the run records,
the report's page, plots and tables -- every byte; the host's wall-clock seconds are only
in timing.csv."""

from pathlib import Path

import pandas as pd

from rlsched.cli import main
from rlsched.compare import TIMING_COLUMNS
from rlsched.traces import sample_trace_path

ARGS = ["--policies", "colocated,async,elastic,partial", "--gpus", "16", "--tp", "2", "--steps", "3",
        "--tasks-per-step", "8"]


def _files(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_same_compare_twice_gives_the_same_bytes(tmp_path, monkeypatch):
    trace = sample_trace_path()
    outs = []
    for name in ("first", "second"):  # different folders: no output path may leak into a file
        out = tmp_path / name
        assert main(["compare", "--trace", str(trace), "--out", str(out), *ARGS]) == 0
        outs.append(_files(out))
    a, b = outs
    assert sorted(a) == sorted(b)
    for must in ("summary.csv", "report.html", "breakdown.csv", "bubbles.csv", "runs/00-colocated/meta.json",
                 "runs/02-elastic/intervals.parquet", "timing.csv"):
        assert must in a, must
    differ = [f for f in a if a[f] != b[f]]
    assert differ == ["timing.csv"] or differ == []  # (equal only if every timing rounds alike)
    timing = pd.read_csv(tmp_path / "first" / "timing.csv")
    assert tuple(timing.columns) == TIMING_COLUMNS
    assert timing["part"].tolist() == ["simulate"] * 4 + ["report"]
    assert timing["policy"].tolist()[:4] == ["colocated", "async", "elastic", "partial"]
    assert timing["run_dir"].tolist()[:4] == ["runs/00-colocated", "runs/01-async", "runs/02-elastic", "runs/03-partial"]
    assert (timing["wall_seconds"] > 0).all()
    summary = pd.read_csv(tmp_path / "first" / "summary.csv")
    assert "wall_seconds" not in summary.columns
    assert b"wall_seconds" not in a["runs/00-colocated/meta.json"]
    assert b"generated 20" not in a["report.html"]  # no date on the page


def test_report_of_the_same_runs_twice_gives_the_same_bytes(tmp_path):
    out = tmp_path / "cmp"
    assert main(["compare", "--trace", str(sample_trace_path()), "--out", str(out), "--no-report", *ARGS]) == 0
    assert not (out / "report.html").exists()
    assert pd.read_csv(out / "timing.csv")["part"].tolist() == ["simulate"] * 4 + ["summary"]
    for name in ("r1", "r2"):
        assert main(["report", str(out), "--out", str(tmp_path / name)]) == 0
    a, b = _files(tmp_path / "r1"), _files(tmp_path / "r2")
    assert sorted(a) == sorted(b) and "report.html" in a
    assert [f for f in a if a[f] != b[f]] == []
