"""Ctrl-C during a replay: the simulator stops where it is, compare stops with it, and what
was simulated is published, marked incomplete (issue 7). In process (a progress callback
raises KeyboardInterrupt, as Python does on SIGINT) and from the shell (a real SIGINT)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import Interrupted
from rlsched.compare import ComparePlan, compare
from rlsched.sim.cost import CostModel
from rlsched.traces import generate_trace, write_trace

SPECS = ("colocated", "elastic", "partial")


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "t.parquet"
    write_trace(generate_trace("longtail-small", seed=1, tasks=16, samples=2), path)
    return path


def _plan(trace: Path) -> ComparePlan:
    return ComparePlan(trace, SPECS, RunConfig(gpus=16, tp=4, steps=4, tasks_per_step=4), CostModel())


def test_ctrl_c_publishes_the_runs_so_far_and_stops(tmp_path: Path, trace: Path) -> None:
    out = tmp_path / "cmp"
    seen: list[tuple[str, int]] = []

    def progress(spec: str, done: int, total: int, now: float) -> None:
        seen.append((spec, done))
        if spec == "elastic" and done == 2:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted) as err:
        compare(_plan(trace), out, progress=progress)
    msg = str(err.value)
    assert "elastic stopped at step 2/4" in msg and "not run: partial" in msg
    assert f"rlsched report {out}/runs/*" in msg
    assert all(spec != "partial" for spec, _ in seen)  # the next policy never started
    s = pd.read_csv(out / "summary.csv")
    assert list(s.policy) == ["colocated", "elastic"]
    assert list(s.complete) == [True, False]
    assert list(s.steps) == [4, 2]
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["00-colocated", "01-elastic"]
    assert not (out / "report.html").exists()
    assert not list(tmp_path.glob(".cmp.tmp-*"))


def test_ctrl_c_with_nothing_simulated_keeps_nothing(tmp_path: Path, trace: Path, monkeypatch) -> None:
    """A Ctrl-C outside the event loop of the first run (here: a fake simulate that is
    interrupted at once) leaves no output folder and no temporary one."""

    def fake_simulate_interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("rlsched.compare.simulate", fake_simulate_interrupted)
    with pytest.raises(KeyboardInterrupt):
        compare(_plan(trace), tmp_path / "cmp")
    assert list(tmp_path.iterdir()) == []


def test_sigint_from_the_shell(tmp_path: Path) -> None:
    """A real SIGINT to ``rlsched compare`` once its first progress line is out: exit 130,
    one line saying what was kept, the interrupted run on disk marked incomplete. The run
    is 200 steps (the 96 tasks cycle; ~30 ms a step here), so the signal lands seconds
    before it could end however slowly the test process reads the line."""
    path = tmp_path / "t.parquet"
    write_trace(generate_trace("swe-seed", seed=0, tasks=96, samples=8), path)
    out = tmp_path / "cmp"
    cmd = [sys.executable, "-c", "import sys; from rlsched.cli import main; sys.exit(main())",
           "compare", "--trace", str(path), "--out", str(out), "--policies", "colocated,async",
           "--gpus", "64", "--steps", "200", "--tasks-per-step", "8"]
    env = dict(os.environ, RLSCHED_PROGRESS_SECONDS="0")
    # (a test suite started in the background of a non-interactive shell runs with SIGINT
    # ignored, which a child inherits and Python then keeps: the child gets the default back)
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("colocated: step 1/200"):
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.stderr.read()
    proc.wait(timeout=120)
    assert proc.returncode == 130, "".join(lines) + rest
    last = rest.strip().splitlines()[-1]
    assert last.startswith("rlsched: interrupted: colocated stopped at step "), rest
    assert "not run: async" in last and "Traceback" not in rest
    s = pd.read_csv(out / "summary.csv")
    assert list(s.policy) == ["colocated"] and not s.complete.item()
    assert 1 <= s.steps.item() < 200
