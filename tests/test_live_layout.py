"""``rlsched run --live`` writes the layout ``rlsched run`` writes (OUT/summary.csv,
OUT/runs/00-SPEC/, OUT/report.html), ``--resume`` finds the run in it or in the layout
before, and what the live backend cannot honour is refused in one line (issues #27, #22).
The live runs themselves are in tests/live/test_layout_logging.py."""

from __future__ import annotations

import json

import pytest

from rlsched.cli.run import find_live_run, prepare_live_out
from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import ConfigError
from rlsched.config import parse_config
from rlsched.real.config import refuse_unsupported


def _manifest(d) -> None:
    (d / "checkpoint").mkdir(parents=True)
    (d / "checkpoint" / "manifest.json").write_text(json.dumps({"version": 1}))


def test_resume_finds_the_run_in_either_layout(tmp_path) -> None:
    old = tmp_path / "old"
    _manifest(old)
    assert find_live_run(old) == old  # recorded before runs/: resumes in place
    new = tmp_path / "new"
    _manifest(new / "runs" / "00-async")
    assert find_live_run(new) == new / "runs" / "00-async"
    _manifest(new / "runs" / "01-elastic")
    with pytest.raises(ConfigError, match="2 live runs under runs/"):
        find_live_run(new)
    sim = tmp_path / "sim"
    (sim / "runs" / "00-async").mkdir(parents=True)
    assert find_live_run(sim) == sim / "runs" / "00-async"  # its meta says why it cannot resume
    assert find_live_run(tmp_path / "none") == tmp_path / "none"


def test_fresh_out_must_be_empty_or_forced(tmp_path) -> None:
    out = tmp_path / "out"
    prepare_live_out(out, force=False)
    (out / "x").write_text("x")
    with pytest.raises(ConfigError, match="not empty"):
        prepare_live_out(out, force=False)
    prepare_live_out(out, force=True)
    assert out.is_dir() and not any(out.iterdir())


def test_rate_faults_are_refused_in_one_line() -> None:
    refuse_unsupported(RunConfig(gpus=2, tp=1, sandbox_slots=1))  # sandbox_slots is honoured
    refuse_unsupported(RunConfig(gpus=2, tp=1, processor=True))  # packed in the trainer (prefix_tree.py)
    for fault, words in (({"kind": "tool", "per_hour": 2.0}, "rate faults are drawn during a simulated run"),
                         ({"kind": "gpu", "per_hour": 2.0}, "give the live run explicit ones")):
        run = parse_config({"cluster": {"gpus": 2, "tp": 1}, "faults": {"fault": [fault]}}).run
        with pytest.raises(ConfigError, match=r"^\[faults\] ") as err:
            refuse_unsupported(run)
        assert words in str(err.value) and "\n" not in str(err.value)
    for kind in ("sync", "gpu", "trainer"):  # injected for real (real/loop/fault_inject.py)
        refuse_unsupported(parse_config({"cluster": {"gpus": 2, "tp": 1},
                                         "faults": {"fault": [{"kind": kind, "at": 5.0}]}}).run)
    tool = parse_config({"cluster": {"gpus": 2, "tp": 1}, "faults": {"fault": [{"kind": "tool", "at": 0.0}]}}).run
    refuse_unsupported(tool)  # injected for real
    with pytest.raises(ConfigError, match="does not re-arm"):
        refuse_unsupported(tool, resume=True)
    refuse_unsupported(parse_config({"cluster": {"gpus": 2, "tp": 1}, "faults": {}}).run)  # no faults


def test_live_tool_faults_arm_at_their_time_and_hit_the_next_call() -> None:
    from rlsched.cluster.faults import Fault, FaultSchedule
    from rlsched.real.loop.faults import LiveFaults

    lf = LiveFaults(FaultSchedule((Fault("tool", at=5.0, trajectory="b"), Fault("tool", at=1.0)), tool_timeout_s=3.0))
    assert lf.next_at() == 1.0 and lf.due(0.5) == []
    assert lf.take_hang("a") is None  # nothing armed yet
    assert [lf.arm(f) for f in lf.due(2.0)] == ["tool: next tool call of any trajectory hangs (cut at 3s)"]
    assert lf.take_hang("a") == 3.0 and lf.take_hang("a") is None  # one call per fault
    assert [lf.arm(f) for f in lf.due(9.0)] == ["tool: next tool call of b hangs (cut at 3s)"]
    assert lf.next_at() is None
    assert lf.take_hang("a") is None and lf.take_hang("b") == 3.0
    assert lf.cut(1.0) == 3.0 and lf.cut(4.0) == 4.0  # a call slower than the limit is not cut shorter
    stats = lf.close(10.0)
    assert (stats["faults"], stats["tool"], stats["tool_seconds_lost"], stats["armed_never_hit"]) == (2, 2, 2.0, 0)


def test_live_sync_faults_arm_one_failure_at_a_time() -> None:
    from rlsched.cluster.faults import Fault, FaultSchedule
    from rlsched.real.loop.faults import LiveFaults

    lf = LiveFaults(FaultSchedule((Fault("sync", at=1.0), Fault("sync", at=2.0), Fault("sync", at=4.0)),
                                  sync_retry_s=7.0))
    assert not lf.take_sync_failure()  # nothing armed: the sync goes through
    assert [lf.arm(f) for f in lf.due(3.0)] == [
        "sync: next weight sync fails (retried after 7s)",
        "sync: a weight-sync failure is already armed: no effect"]  # as simulated
    assert lf.take_sync_failure() and not lf.take_sync_failure()  # one sync fails, its retry does not
    [f] = lf.due(5.0)
    lf.arm(f)
    stats = lf.close(6.0)
    assert (stats["faults"], stats["sync"], stats["without_effect"], stats["armed_never_hit"]) == (3, 3, 1, 1)


def test_live_gpu_fault_targets_must_exist() -> None:
    from rlsched.cluster.faults import Fault, FaultSchedule
    from rlsched.real.loop.faults import LiveFaults

    with pytest.raises(ConfigError, match=r"gpu=2: the cluster has GPUs 0\.\.1"):
        LiveFaults(FaultSchedule((Fault("gpu", at=1.0, gpu=2),)), gpus=2)
    lf = LiveFaults(FaultSchedule((Fault("gpu", at=1.0, gpu=1, recover_s=3.0),)), gpus=2)
    with pytest.raises(ValueError, match="acts at once"):
        lf.arm(lf.due(1.0)[0])
    lf.fail_since[1] = 2.0  # failed at t=2 and never recovered: counted to the end, as simulated
    assert lf.close(10.0)["failed_gpu_seconds"] == 8.0


def test_resume_of_a_simulated_run_is_refused_in_one_line(tmp_path, capsys) -> None:
    from rlsched.cli import main
    from rlsched.real.loop.checkpoint import read_manifest

    out = tmp_path / "sim"
    assert main(["run", "--policy", "colocated", "--steps", "1", "--gpus", "4", "--tp", "1",
                 "--model", "none", "--out", str(out)]) == 0
    with pytest.raises(ConfigError, match="run, not a live run; only `run --live` runs resume"):
        read_manifest(find_live_run(out))
