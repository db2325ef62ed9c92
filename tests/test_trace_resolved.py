"""A run started with a relative ``--trace`` is reported with the file it replayed, from
any folder.

``meta.json``'s ``trace`` is kept as given (a public field), often relative to the folder
the run was started from. ``rlsched report`` started elsewhere found no trace (no trace
statistics), or, worse, another file of that relative name in its own folder, and showed
that file's statistics with a warning that the trace had changed. The run now also records
``trace_resolved`` (the absolute path), and a candidate whose bytes are not the recorded
ones gives way to one whose bytes are.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from fuzz_kit import judge_cli, run_cli

from rlsched.analysis.comparable import run_trace

SMALL = ("--steps", "1", "--tasks-per-step", "4", "--gpus", "4", "--tp", "1", "--model", "none")


def write_rows(path: Path, seed: int) -> Path:
    """A small trace whose lengths (and bytes) depend on ``seed``: 4 + seed tasks."""
    rows = [(f"t{t}", f"t{t}-{k}", turn, 30 + t, 10 + 3 * k + seed, 0.5)
            for t in range(4 + seed) for k in range(2) for turn in range(2)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=["task_id", "trajectory_id", "turn", "prompt_tokens", "output_tokens",
                                "env_seconds"]).to_parquet(path)
    return path


def test_a_relative_trace_is_found_from_another_folder_even_beside_a_file_of_its_name(tmp_path, monkeypatch):
    started = tmp_path / "project"
    replayed = write_rows(started / "traces" / "t.parquet", seed=0)
    monkeypatch.chdir(started)
    res = run_cli(["compare", "--trace", "traces/t.parquet", *SMALL, "--policies", "colocated", "--no-report",
                   "--out", str(tmp_path / "out")])
    assert judge_cli(res, False) == "ok", res.err
    run = tmp_path / "out" / "runs" / "00-colocated"
    meta = json.loads((run / "meta.json").read_text())
    assert meta["trace"] == "traces/t.parquet"  # (kept as given)
    assert meta["trace_resolved"] == str(replayed.resolve())

    elsewhere = tmp_path / "elsewhere"
    other = write_rows(elsewhere / "traces" / "t.parquet", seed=3)  # another file, same relative name
    monkeypatch.chdir(elsewhere)
    assert run_trace(run, meta) == replayed.resolve()
    res = run_cli(["report", str(run), "--out", str(tmp_path / "rep")])
    assert judge_cli(res, False) == "ok", res.err
    assert "is not the file" not in res.err  # (was: the other file, said to have changed)
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "not readable from here" not in page and "is not the file" not in page

    other.unlink()  # (and from a folder with no file of that name: was no trace statistics)
    res = run_cli(["report", str(run), "--out", str(tmp_path / "rep2")])
    assert judge_cli(res, False) == "ok", res.err
    assert "not readable from here" not in (tmp_path / "rep2" / "report.html").read_text()


def test_without_a_recorded_digest_the_path_as_given_comes_first(tmp_path, monkeypatch):
    """Records written before the digest (or edited) keep the old order: the path as given
    from here, then the absolute one."""
    a = write_rows(tmp_path / "a" / "t.parquet", seed=0)
    b = write_rows(tmp_path / "b" / "t.parquet", seed=1)
    monkeypatch.chdir(tmp_path / "a")
    meta = {"trace": "t.parquet", "trace_resolved": str(b)}
    assert run_trace(tmp_path / "run", meta) == Path("t.parquet")
    monkeypatch.chdir(tmp_path)
    assert run_trace(tmp_path / "run", meta) == b
    assert run_trace(tmp_path / "run", {"trace": str(a)}) == a


def test_plan_report_runs_record_where_the_trace_was(tmp_path, monkeypatch):
    write_rows(tmp_path / "traces" / "t.parquet", seed=0)
    monkeypatch.chdir(tmp_path)
    res = run_cli(["plan", "--trace", "traces/t.parquet", "--gpus", "4", "--tp", "1", "--model", "none",
                   "--steps", "1", "--tasks-per-step", "4", "--trials", "2", "--workers", "1",
                   "--resamples", "1", "--no-sensitivity", "--out", str(tmp_path / "plan")])
    assert judge_cli(res, False) == "ok", res.err
    metas = [json.loads(p.read_text()) for p in (tmp_path / "plan").glob("runs/*/meta.json")]
    assert metas and all(m["trace"] == "traces/t.parquet" for m in metas)
    assert all(m["trace_resolved"] == str((tmp_path / "traces" / "t.parquet").resolve()) for m in metas)
