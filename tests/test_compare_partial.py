"""A policy that fails during its run after others finished keeps their runs: ``rlsched
compare`` publishes them (summary.csv, records, report) to --out, then ends with one error
line naming the failed policy, its error and what was kept. Before, the one line came
alone and the finished runs -- possibly hours of them -- were deleted with the output."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pandas as pd
import pytest

from rlsched.cli import main
from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import Interrupted, PolicyError
from rlsched.cluster.events import TrainStepFinished
from rlsched.cluster.record import runs_in
from rlsched.compare import ComparePlan, compare
from rlsched.policies import registry
from rlsched.policies.colocated import Colocated
from rlsched.sim.cost import CostModel

SMALL = ["--gpus", "16", "--steps", "2", "--tasks-per-step", "4", "--samples-per-task", "2"]


class FailsAfterStep1(Colocated):
    """colocated until its first optimizer step is trained, then a user error (what a
    policy refusing its settings mid-run raises): it passes every check made before runs."""

    name: ClassVar[str] = "test-fails-mid-run"

    def on_event(self, event, view):  # type: ignore[no-untyped-def]
        if isinstance(event, TrainStepFinished) and event.version >= 1:
            raise PolicyError("test-fails-mid-run: refused after step 1")
        return super().on_event(event, view)


class BugAfterStep1(Colocated):
    """The same, failing with a bug (not a user error) instead."""

    name: ClassVar[str] = "test-bug-mid-run"

    def on_event(self, event, view):  # type: ignore[no-untyped-def]
        if isinstance(event, TrainStepFinished) and event.version >= 1:
            raise RuntimeError("test-bug-mid-run: a bug")
        return super().on_event(event, view)


@pytest.fixture(autouse=True)
def failing_policies():
    for cls in (FailsAfterStep1, BugAfterStep1):
        registry.register(cls)
    yield
    for cls in (FailsAfterStep1, BugAfterStep1):
        registry._REGISTRY.pop(cls.name, None)


def _compare(out: Path, trace: Path, *extra: str) -> int:
    return main(["compare", "--trace", str(trace), "--out", str(out), *SMALL, *extra])


def test_a_later_policy_failing_publishes_the_finished_runs(tmp_path, compare_trace, capsys):
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "old.txt").write_text("the folder --force replaces")
    rc = _compare(out, compare_trace, "--policies", "colocated,async,test-fails-mid-run,elastic", "--force")
    assert rc == 2
    captured = capsys.readouterr()
    last = captured.err.strip().splitlines()[-1]
    assert last == (f"rlsched: error: policy test-fails-mid-run failed: test-fails-mid-run: refused after "
                    f"step 1; wrote {out / 'summary.csv'} with the 2 runs that finished (colocated, async) "
                    "and report.html; not run: elastic")
    assert "Traceback" not in captured.err
    assert "colocated" in captured.out and "async" in captured.out  # the finished runs' table
    s = pd.read_csv(out / "summary.csv")
    assert list(s.policy) == ["colocated", "async"] and (s.steps == 2).all()
    assert (out / "report.html").is_file()
    # the failed run left no folder: only the finished runs are under runs/, and are runs
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["00-colocated", "01-async"]
    assert [p.name for p in runs_in(out)] == ["00-colocated", "01-async"]
    # published as a whole: the old folder was replaced, nothing left beside it
    assert not (out / "old.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp"]
    assert main(["report", str(out), "--out", str(tmp_path / "rep")]) == 0


def test_without_a_report_the_line_says_summary_only(tmp_path, compare_trace, capsys):
    out = tmp_path / "cmp"
    assert _compare(out, compare_trace, "--policies", "colocated,test-fails-mid-run", "--no-report") == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.endswith(f"wrote {out / 'summary.csv'} with the 1 run that finished (colocated)"), last
    assert list(pd.read_csv(out / "summary.csv").policy) == ["colocated"]
    assert not (out / "report.html").exists()


def test_the_first_policy_failing_writes_nothing_and_keeps_the_old_out(tmp_path, compare_trace, capsys):
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "old.txt").write_text("mine")
    assert _compare(out, compare_trace, "--policies", "test-fails-mid-run,colocated", "--force") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "rlsched: error: test-fails-mid-run: refused after step 1"
    assert [p.name for p in out.iterdir()] == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp"]


def test_a_bug_in_a_later_policy_keeps_the_finished_runs_and_its_traceback(tmp_path, compare_trace):
    """A bug is not turned into a user's one-line error (its traceback is the bug report),
    but the finished runs are published all the same, and a note on it says so."""
    out = tmp_path / "cmp"
    plan = ComparePlan(compare_trace, ("colocated", "test-bug-mid-run"),
                       RunConfig(gpus=16, steps=2, tasks_per_step=4, samples_per_task=2), CostModel())
    with pytest.raises(RuntimeError, match="a bug") as err:
        compare(plan, out, report=False)
    assert err.value.__notes__ == [f"rlsched compare: policy test-bug-mid-run failed; wrote "
                                   f"{out / 'summary.csv'} with the 1 run that finished (colocated)"]
    assert list(pd.read_csv(out / "summary.csv").policy) == ["colocated"]
    assert [p.name for p in runs_in(out)] == ["00-colocated"]


def test_run_failed_carries_the_cause_and_the_rows(tmp_path, compare_trace):
    from rlsched.compare import RunFailed

    plan = ComparePlan(compare_trace, ("colocated", "test-fails-mid-run"),
                       RunConfig(gpus=16, steps=2, tasks_per_step=4, samples_per_task=2), CostModel())
    with pytest.raises(RunFailed) as err:
        compare(plan, tmp_path / "cmp", report=False)
    assert isinstance(err.value.__cause__, PolicyError) and err.value.spec == "test-fails-mid-run"
    assert list(err.value.summary.policy) == ["colocated"] and err.value.exit_code == 2


def test_ctrl_c_while_the_report_is_written_keeps_the_runs(tmp_path, compare_trace, monkeypatch):
    """Every run finished, then Ctrl-C while the report was being written: all of it was
    deleted. Now the runs and summary.csv are published without the report's part-written
    files, and :class:`Interrupted` (exit 130) says so."""
    import rlsched.analysis.report as report

    def interrupted(tables, figures, out_dir, **kwargs):
        (out_dir / "breakdown.csv").write_text("half")
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "write_collected", interrupted)
    out = tmp_path / "cmp"
    plan = ComparePlan(compare_trace, ("colocated", "async"),
                       RunConfig(gpus=16, steps=2, tasks_per_step=4, samples_per_task=2), CostModel())
    with pytest.raises(Interrupted, match=r"^stopped while the report was being written; wrote 2 run "
                                          r"record\(s\) and summary.csv to .*cmp; no report") as err:
        compare(plan, out)
    assert err.value.exit_code == 130
    assert sorted(p.name for p in out.iterdir()) == ["runs", "summary.csv", "timing.csv"]
    assert list(pd.read_csv(out / "summary.csv").policy) == ["colocated", "async"]
    assert [p.name for p in runs_in(out)] == ["00-colocated", "01-async"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp"]
