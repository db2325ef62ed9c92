"""``rlsched trace import`` through a typer app built here (the lead wires ``register`` into
``rlsched/cli/__init__.py``), and an imported trace replayed by ``rlsched compare``."""

from __future__ import annotations

import pandas as pd
import pytest
import typer
from importkit import BROKEN, MESSAGES, SWE
from typer.testing import CliRunner

from rlsched.cli import main
from rlsched.cli.trace_import import register
from rlsched.cluster.errors import ConfigError, TraceError
from rlsched.traces import load_trace, trace_stats


@pytest.fixture(scope="module")
def app():
    trace_app = typer.Typer()
    register(trace_app)

    @trace_app.command("noop")  # a second command keeps typer from flattening the group
    def noop() -> None: ...

    root = typer.Typer()
    root.add_typer(trace_app, name="trace")
    return root


def test_import_writes_a_valid_trace_and_prints_the_summary(app, tmp_path):
    out = tmp_path / "swe.parquet"
    res = CliRunner().invoke(app, ["trace", "import", "--format", "swe-agent", str(SWE),
                                   str(BROKEN), "--out", str(out)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == ("imported 3 trajectories (10 turns, 3 tasks) from 4 file(s); "
                        "skipped 1:")
    assert lines[1].startswith(f"  skipped {BROKEN / 'astropy__astropy-14182.traj'}: "
                               f"invalid JSON")
    assert "tokens counted with estimate:chars/4" in res.output
    assert "env time estimated on 3 of 10 turns" in res.output
    assert "truncated trajectories: 2" in res.output
    df = load_trace(out)
    assert len(df) == 10 and df["env_estimated"].sum() == 3
    assert trace_stats(df).loc["truncated", "count"] == 2


def test_all_skipped_fails_and_writes_nothing(app, tmp_path):
    out = tmp_path / "none.parquet"
    res = CliRunner().invoke(app, ["trace", "import", "-f", "swe-agent", str(BROKEN), "-o",
                                   str(out)])
    assert isinstance(res.exception, TraceError)
    assert str(res.exception).startswith("nothing imported, every input was skipped: ")
    assert not out.exists()


def test_unknown_format_suggests(app, tmp_path):
    res = CliRunner().invoke(app, ["trace", "import", "-f", "swe_agent", str(SWE), "-o",
                                   str(tmp_path / "x.parquet")])
    assert isinstance(res.exception, TraceError)
    assert "did you mean 'swe-agent'?" in str(res.exception)


def test_imported_trace_runs_through_compare(app, tmp_path, capsys):
    trace = tmp_path / "msgs.parquet"
    res = CliRunner().invoke(app, ["trace", "import", "-f", "messages", str(MESSAGES), "-o",
                                   str(trace)])
    assert res.exit_code == 0, res.output
    out = tmp_path / "cmp"
    code = main(["compare", "--trace", str(trace), "--policies", "colocated,async",
                 "--out", str(out), "--gpus", "8", "--tp", "2", "--steps", "2", "--model", "none",
                 "--tasks-per-step", "2", "--samples-per-task", "1", "--no-report"])
    assert code == 0, capsys.readouterr().err
    summary = pd.read_csv(out / "summary.csv")
    assert summary["policy"].tolist() == ["colocated", "async"]
    assert (summary["steps"] == 2).all() and (summary["lost_trajectories"] == 0).all()


def test_out_naming_a_log_being_imported_is_refused_and_the_log_kept(app, tmp_path):
    log = tmp_path / "chat.jsonl"
    log.write_bytes(MESSAGES.read_bytes())
    before = log.read_bytes()
    res = CliRunner().invoke(app, ["trace", "import", "-f", "messages", "-o", str(log), str(log)])
    assert isinstance(res.exception, ConfigError)
    assert str(res.exception) == (f"--out {log}: is the log {log} being imported, which writing the trace "
                                  "would overwrite; give another file name")
    assert log.read_bytes() == before
