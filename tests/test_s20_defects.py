"""Session 20: five user-facing defects noticed in earlier reviews, each pinned here.

1. A run's ``meta.json`` held no trace digest: two runs of one trace path whose file was
   replaced in between looked like one setup to ``rlsched report A B``.
2. ``rlsched report`` accepted an edited ``meta.json`` with impossible values (``tp`` 0,
   ``makespan_seconds`` 1e308, a string for a number) and drew a report of nonsense.
3. ``rlsched compare``: when a policy failed and then writing the finished runs' results
   failed too, only the second error was shown; the policy's was lost.
4. A trace whose token counts are all 0 was warned about as "trajectories ended before
   finishing a turn", though every trajectory finished ``done``.
5. ``tasks_per_step`` far above the trace's tasks (1,000,000 on 2) drew millions of copies
   of the same recordings and simulated for minutes with the progress bar at step 0.

Commands go through ``rlsched.cli.main`` in-process (``fuzz_kit.run_cli``) and are judged
by ``test_fuzz_cli.py``'s rules: a failure is exit code 2 and one ``rlsched: error:`` line.
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from fuzz_kit import judge_cli, one_error, run_cli, with_meta

import rlsched.compare as compare_module
from rlsched.cluster.errors import Interrupted, PolicyError
from rlsched.cluster.record import read_run
from rlsched.traces import digest

SMALL = ("--steps", "1", "--tasks-per-step", "4", "--gpus", "4", "--tp", "1", "--model", "none")


def write_rows(path: Path, seed: int = 0, tokens: int = 1) -> Path:
    """A small trace (4 tasks x 2 samples x 2 turns); ``seed`` changes its lengths (and so
    its bytes), ``tokens=0`` zeroes every token count."""
    rows = [(f"t{t}", f"t{t}-{k}", turn, tokens * (30 + seed + t), tokens * (10 + 3 * k + seed), 0.5)
            for t in range(4) for k in range(2) for turn in range(2)]
    pd.DataFrame(rows, columns=["task_id", "trajectory_id", "turn", "prompt_tokens", "output_tokens",
                                "env_seconds"]).to_parquet(path)
    return path


def compare_ok(trace: Path, out: Path, *args: str) -> Path:
    res = run_cli(["compare", "--trace", str(trace), *SMALL, "--policies", "colocated", "--no-report",
                   *args, "--out", str(out)])
    assert judge_cli(res, False) == "ok", res.err
    return out / "runs" / "00-colocated"


def warning_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("rlsched: warning: ")]


# ------------------------------------------------------------ 1. the trace's digest


def test_a_run_records_the_sha256_and_size_of_the_trace_it_replayed(tmp_path):
    trace = write_rows(tmp_path / "t.parquet")
    meta = json.loads((compare_ok(trace, tmp_path / "out") / "meta.json").read_text())
    assert meta["trace"] == str(trace)
    assert meta["trace_sha256"] == hashlib.sha256(trace.read_bytes()).hexdigest()
    assert meta["trace_bytes"] == trace.stat().st_size


def test_report_says_when_one_trace_path_held_other_bytes_for_each_run(tmp_path):
    """Was: no warning at all (the two runs named one path, and only the file now on disk
    was compared, with itself)."""
    trace = tmp_path / "t.parquet"
    write_rows(trace, seed=0)
    a = compare_ok(trace, tmp_path / "A")
    old = hashlib.sha256(trace.read_bytes()).hexdigest()[:8]
    write_rows(trace, seed=5)  # (replaced in place)
    new = hashlib.sha256(trace.read_bytes()).hexdigest()[:8]
    b = compare_ok(trace, tmp_path / "B")
    res = run_cli(["report", str(a), str(b), "--out", str(tmp_path / "rep")])
    assert judge_cli(res, False) == "ok"
    (line,) = warning_lines(res.err)
    assert (f"differ in trace (t.parquet: replaced between the runs; SHA-256 {old} vs {new})" in line
            and f"t.parquet on disk now (SHA-256 {new}) is not the file {a} replayed (SHA-256 {old})" in line), line
    assert "replaced between the runs" in (tmp_path / "rep" / "report.html").read_text()


def test_report_says_when_the_trace_changed_after_the_runs(tmp_path):
    trace = write_rows(tmp_path / "t.parquet", seed=0)
    a, b = compare_ok(trace, tmp_path / "A"), compare_ok(trace, tmp_path / "B")
    res = run_cli(["report", str(a), str(b), "--out", str(tmp_path / "rep")])
    assert judge_cli(res, False) == "ok" and not warning_lines(res.err)  # (one setup, unchanged)
    write_rows(trace, seed=5)
    for runs in ([a, b], [a]):  # (one run too: the page's trace statistics are of the file now)
        res = run_cli(["report", *map(str, runs), "--out", str(tmp_path / f"rep{len(runs)}")])
        assert judge_cli(res, False) == "ok"
        (line,) = warning_lines(res.err)
        who = "the runs" if len(runs) == 2 else str(a)
        assert "t.parquet on disk now (SHA-256 " in line and f"is not the file {who} replayed" in line, line
        assert "differ in" not in line  # (the runs replayed the same bytes)
        assert "is not the file" in (tmp_path / f"rep{len(runs)}" / "report.html").read_text()


def test_records_without_the_digest_are_compared_as_before(tmp_path):
    """A record written before ``trace_sha256`` existed: two runs of one path are one setup
    (the file now on disk is all there is to compare), whatever happened to the file."""
    from rlsched.analysis.comparable import setup_differences, setup_warning

    trace = write_rows(tmp_path / "t.parquet", seed=0)
    a = compare_ok(trace, tmp_path / "A")
    write_rows(trace, seed=5)
    b = compare_ok(trace, tmp_path / "B")
    runs = []
    for run in (a, b):
        meta = json.loads((run / "meta.json").read_text())
        for key in ("trace_sha256", "trace_bytes"):
            del meta[key]
        runs.append((run, meta))
    assert setup_differences(runs) == [] and setup_warning(runs) is None
    # one with it, one without: the other's file now on disk stands for what it replayed
    with_digest = (a, json.loads((a / "meta.json").read_text()))
    assert setup_differences([with_digest, runs[1]]) == [
        "trace (t.parquet: files with different contents)"]


def test_compare_and_its_report_read_the_trace_for_its_digest_once(tmp_path, monkeypatch):
    """A trace may be gigabytes: one read for every policy's record and the report's checks."""
    trace = write_rows(tmp_path / "t.parquet")
    reads = []
    real = digest._sha256
    monkeypatch.setattr(digest, "_sha256", lambda path: reads.append(path) or real(path))
    res = run_cli(["compare", "--trace", str(trace), *SMALL, "--policies", "colocated,async",
                   "--out", str(tmp_path / "out")])
    assert judge_cli(res, False) == "ok"
    assert (tmp_path / "out" / "report.html").exists() and len(reads) == 1
    res = run_cli(["report", str(tmp_path / "out"), "--out", str(tmp_path / "rep")])
    assert judge_cli(res, False) == "ok" and len(reads) == 1  # (same file version: cached)


# ------------------------------------------------------------ 2. impossible meta values


@pytest.fixture(scope="module")
def one_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("run")
    return compare_ok(write_rows(folder / "t.parquet"), folder / "out")


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("tp", 0, "field tp=0: expected an integer >= 1 and at most 4 (GPUs per engine, of num_gpus=4)"),
    ("tp", 8, "field tp=8: expected an integer >= 1 and at most 4 (GPUs per engine, of num_gpus=4)"),
    ("tp", "1", "field tp='1': expected an integer >= 1 and at most 4 (GPUs per engine, of num_gpus=4)"),
    ("num_gpus", -3, "field num_gpus=-3: expected an integer >= 1"),
    ("makespan_seconds", 1e308, "field makespan_seconds=1e+308: expected a finite number >= 0 and at "
                                "most 1e+12 (seconds: 1e+12 is about 31,700 years)"),
    ("makespan_seconds", float("nan"), "field makespan_seconds=nan: expected a finite number >= 0 and at "
                                       "most 1e+12 (seconds: 1e+12 is about 31,700 years)"),
    ("makespan_seconds", "12", "field makespan_seconds='12': expected a finite number >= 0 and at "
                               "most 1e+12 (seconds: 1e+12 is about 31,700 years)"),
    ("lower_bound_seconds", 1e300, "field lower_bound_seconds=1e+300: expected a finite number >= 0 and "
                                   "at most 1e+12 (seconds: 1e+12 is about 31,700 years)"),
    ("steps_done", -1, "field steps_done=-1: expected an integer >= 0 and at most 10,000,000"),
    ("max_staleness_bound", "x", "field max_staleness_bound='x': expected an integer >= 0"),
    ("events_processed", 2.5, "field events_processed=2.5: expected an integer >= 0"),
    ("driver", "gpu", "field driver='gpu': expected one of sim, live"),
    ("spec_as_given", 7, "field spec_as_given=7: expected a string"),
    ("config", [1], "field config=[1]: expected an object (or null)"),
    ("faults", {"faults": -5}, "field faults.faults=-5: expected a finite number >= 0"),
    ("trace_sha256", "abc", "field trace_sha256='abc': expected the trace file's SHA-256, 64 lowercase "
                            "hex digits"),
    ("trace_bytes", -1, "field trace_bytes=-1: expected an integer >= 0"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 24 else None)
def test_report_refuses_an_impossible_meta_value_in_one_line(tmp_path, one_run, key, value, expected):
    """Each was read into a report of nonsense without a word (tp 0 and "1" shown as the
    cluster's; makespan 1e308 gave utilization 0 and a collapsed plot; steps_done -1 was
    summary.csv's steps), or silently replaced by a default (max_staleness_bound "x",
    events_processed 2.5, spec_as_given 7)."""
    run = with_meta(one_run, tmp_path / "run", key, value)
    err = one_error(["report", str(run), "--out", str(tmp_path / "r")])
    assert err == f"rlsched: error: {run / 'meta.json'}: {expected}"
    # beside another run: the same one line, and no setup warning before it
    err = one_error(["report", str(one_run), str(run), "--out", str(tmp_path / "r2")])
    assert err == f"rlsched: error: {run / 'meta.json'}: {expected}"


def test_report_still_reads_records_without_the_newer_fields(tmp_path, one_run):
    run = tmp_path / "run"
    shutil.copytree(one_run, run)
    meta = json.loads((run / "meta.json").read_text())
    for key in ("tp", "steps_done", "max_staleness_bound", "events_processed", "driver", "spec_as_given",
                "trace_sha256", "trace_bytes", "faults"):
        meta.pop(key, None)
    meta["lower_bound_seconds"] = None
    (run / "meta.json").write_text(json.dumps(meta))
    res = run_cli(["report", str(run), "--out", str(tmp_path / "r")])
    assert judge_cli(res, False) == "ok"


# ------------------------------------------------------------ 3. two failures in compare


def _fail_second_policy(monkeypatch, error: BaseException) -> None:
    real = compare_module.simulate
    calls = []

    def simulate(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(compare_module, "simulate", simulate)


def _fail_write(monkeypatch, error: BaseException) -> None:
    def write(*args, **kwargs):
        raise error

    monkeypatch.setattr(compare_module, "_write_summary", write)


def _compare_two(trace: Path, out: Path):
    return run_cli(["compare", "--trace", str(trace), *SMALL, "--policies", "colocated,async",
                    "--out", str(out)])


def test_the_policy_error_is_said_when_writing_the_results_fails_too(tmp_path, monkeypatch):
    """Was an OSError traceback about summary.csv; the policy's own error appeared nowhere."""
    trace = write_rows(tmp_path / "t.parquet")
    _fail_second_policy(monkeypatch, PolicyError("policy async: step 0: a setting the user can fix"))
    _fail_write(monkeypatch, OSError(errno.ENOSPC, "No space left on device", "summary.csv"))
    res = _compare_two(trace, tmp_path / "out")
    # (stderr: the finished policy's progress line, then the one error line)
    assert res.code == 2 and "Traceback" not in res.err
    (line,) = [ln for ln in res.err.splitlines() if ln.startswith("rlsched: ")]
    assert line == (
        "rlsched: error: policy async failed: policy async: step 0: a setting the user can fix; then "
        "writing summary.csv and the report of the 1 run that finished (colocated) failed too: No "
        "space left on device (summary.csv)")
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # (no temporary left)


def test_the_policy_error_is_said_when_the_write_is_interrupted(tmp_path, monkeypatch):
    trace = write_rows(tmp_path / "t.parquet")
    _fail_second_policy(monkeypatch, PolicyError("policy async: bad"))
    _fail_write(monkeypatch, KeyboardInterrupt())
    plan = compare_module.ComparePlan(trace, ("colocated", "async"), _config(), _cost())
    try:
        with pytest.raises(Interrupted, match=r"^policy async failed: policy async: bad; then writing "
                                              r"summary\.csv and the report .* failed too: interrupted"):
            compare_module.compare(plan, tmp_path / "out")
    except KeyboardInterrupt:  # (as it was: the bare Ctrl-C, the policy's error lost)
        pytest.fail("the Ctrl-C came out alone: the policy's error was lost")


def test_a_bug_while_writing_carries_the_policy_error_as_a_note(tmp_path, monkeypatch):
    trace = write_rows(tmp_path / "t.parquet")
    _fail_second_policy(monkeypatch, PolicyError("policy async: bad"))
    _fail_write(monkeypatch, TypeError("a bug in the report"))
    plan = compare_module.ComparePlan(trace, ("colocated", "async"), _config(), _cost())
    with pytest.raises(TypeError, match="a bug in the report") as info:
        compare_module.compare(plan, tmp_path / "out")
    assert any("policy async had failed first: policy async: bad" in n for n in info.value.__notes__)


def test_a_policy_bug_stays_the_error_when_writing_fails_too(tmp_path, monkeypatch):
    trace = write_rows(tmp_path / "t.parquet")
    _fail_second_policy(monkeypatch, ZeroDivisionError("division by zero"))
    _fail_write(monkeypatch, OSError(errno.EACCES, "Permission denied", "summary.csv"))
    plan = compare_module.ComparePlan(trace, ("colocated", "async"), _config(), _cost())
    with pytest.raises(ZeroDivisionError) as info:
        compare_module.compare(plan, tmp_path / "out")
    assert any("failed too: Permission denied (summary.csv)" in n for n in info.value.__notes__)


def _config():
    from rlsched.cluster.config import RunConfig

    return RunConfig(gpus=4, tp=1, steps=1, tasks_per_step=4)


def _cost():
    from rlsched.sim.presets import resolve_cost

    return resolve_cost("none", None, None, {}, "test")


# ------------------------------------------------------------ 4. a trace of 0 tokens


def test_a_trace_of_zero_tokens_is_not_called_cut_short(tmp_path):
    trace = write_rows(tmp_path / "zero.parquet", tokens=0)
    res = run_cli(["compare", "--trace", str(trace), *SMALL, "--policies", "colocated",
                   "--no-report", "--out", str(tmp_path / "out")])
    assert judge_cli(res, False) == "ok"
    run = read_run(tmp_path / "out" / "runs" / "00-colocated")
    assert set(run.trajectories["finish_status"]) == {"done"}
    assert "ended before finishing a turn" not in res.err
    assert ("warning: colocated trained no tokens: the 8 trajectories it trained finished (done) but "
            "hold no tokens: their turns' prompt_tokens and output_tokens are 0 in the trace") in res.err


def test_the_no_tokens_reason_names_what_cut_trajectories_short():
    from rlsched.analysis.metrics import no_tokens_reason

    t = pd.DataFrame({"status": ["dropped", "trained"], "finish_status": ["timed_out", "done"],
                      "turns_done": [0, 2], "prompt_tokens": [0, 0], "output_tokens": [0, 0]})
    assert no_tokens_reason(t).startswith("1 of its 2 trajectories ended before finishing a turn")
    assert no_tokens_reason(t.iloc[:1]).startswith("its trajectories ended before finishing a turn")
    assert no_tokens_reason(t.iloc[:0]) == "it ran no trajectories"


# ------------------------------------------------------------ 5. tasks_per_step past the trace


def test_tasks_per_step_above_the_traces_tasks_is_refused_at_once(tmp_path):
    """Was minutes of simulation (4,000,000 copies of 2 recordings) at step 0 of the bar."""
    trace = tmp_path / "two.parquet"
    pd.DataFrame([("a", "a0", 0, 10, 5, 1.0), ("b", "b0", 0, 10, 5, 1.0)],
                 columns=["task_id", "trajectory_id", "turn", "prompt_tokens", "output_tokens",
                          "env_seconds"]).to_parquet(trace)
    expected = (f"rlsched: error: tasks_per_step=1,000,000: the trace {trace} has 2 tasks and a step "
                "draws each at most once; expected at most 2 (more steps than the trace covers wrap "
                "around to its first task)")
    base = ["--trace", str(trace), "--gpus", "4", "--tp", "1", "--model", "none", "--tasks-per-step"]
    assert one_error(["compare", *base, "1000000", "--policies", "colocated",
                      "--out", str(tmp_path / "o")]) == expected
    assert one_error(["plan", *base, "3", "--out", str(tmp_path / "p")]) == expected.replace(
        "1,000,000", "3")
    assert not (tmp_path / "o").exists() and not (tmp_path / "p").exists()
    # as many tasks as the trace has, over more steps than it covers: the pool wraps, as before
    res = run_cli(["compare", *base, "2", "--steps", "3", "--policies", "colocated", "--no-report",
                   "--out", str(tmp_path / "ok")])
    assert judge_cli(res, False) == "ok"
    assert len(read_run(tmp_path / "ok" / "runs" / "00-colocated").trajectories) == 6
