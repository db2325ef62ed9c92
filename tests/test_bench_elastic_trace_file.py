"""``bench/bench_elastic.py --trace-file``: a trace of one's own (say, imported from real agent
logs) is benched like the bench's own traces, with its own samples per task."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from rlsched.traces import generate_trace, write_trace

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_elastic.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_elastic", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _trace(path: Path, tasks: int, samples: int) -> Path:
    df = generate_trace("longtail-small", seed=0, tasks=tasks, samples=samples, turns_scale=0.1,
                        branch_frac=0.0)
    return write_trace(df, path)


def test_step_matches_the_bench_trajectories_or_takes_every_task(tmp_path: Path) -> None:
    step = _bench().trace_file_step
    many = _trace(tmp_path / "many.parquet", tasks=40, samples=2)
    # 8 GPUs: the bench's own traces give 2 x 8 = 16 trajectories a step -> 8 tasks of 2
    tasks, samples, note = step(str(many), 8)
    assert (tasks, samples) == (8, 2)
    assert "8 tasks per step match them (~16 trajectories)" in note
    few = _trace(tmp_path / "few.parquet", tasks=3, samples=2)
    # 64 GPUs would want 64 tasks of 2; the trace has 3: every step takes all of them
    tasks, samples, note = step(str(few), 64)
    assert (tasks, samples) == (3, 2)
    assert "takes all 3 tasks (~6 trajectories; 64 tasks would match)" in note


def test_trace_file_alone_prints_its_table_and_summary_row(tmp_path: Path) -> None:
    df = generate_trace("longtail-small", seed=0, tasks=3, samples=1, turns_scale=0.1,
                        branch_frac=0.0)
    # as an importer names an instance that ran twice: "x" and "x#2" -- 12 steps of the
    # 3 tasks draw "t0000-s00" again, which must not take the run id "t0000-s00#2"
    df["trajectory_id"] = df["trajectory_id"].replace({"t0001-s00": "t0000-s00#2"})
    assert (df["trajectory_id"] == "t0000-s00#2").any()
    path = write_trace(df, tmp_path / "tiny-real.parquet")
    out = subprocess.run(
        [sys.executable, str(BENCH), "--gpus", "16", "--traces", "none", "--trace-file", str(path),
         "--workers", "1"],
        capture_output=True, text=True, timeout=600, check=True,
    ).stdout
    assert "### tiny-real: 16 GPUs, 12 steps, 3 tasks x 1 samples per step" in out
    assert "each step takes all 3 tasks" in out
    assert "| colocated |" in out and "| elastic:staleness=1 |" in out
    assert "staleness within each policy's bound and every run complete: yes" in out
    assert "| tiny-real | 16 |" in out
    assert "longtail-small" not in out  # --traces none: none of the bench's own traces


def test_traces_none_without_a_trace_file_is_refused() -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--traces", "none"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "give at least one --trace-file" in proc.stderr


@pytest.mark.parametrize("content", [None, "not a trace\n"])
def test_a_missing_or_broken_trace_file_is_refused_before_any_run(tmp_path: Path,
                                                                   content: str | None) -> None:
    path = tmp_path / "bad.parquet"
    if content is not None:
        path.write_text(content)
    proc = subprocess.run([sys.executable, str(BENCH), "--gpus", "8", "--traces", "longtail",
                           "--trace-file", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"--trace-file {path}" in proc.stderr
    assert "###" not in proc.stdout  # refused before the longtail table ran
