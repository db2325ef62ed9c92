"""Session 19's adversarial audit of the command line and its input files.

Each test pins one defect the audit found: a traceback, a misleading line, an absurd value
accepted into garbage figures, or a run that took hours on a value the checks allow. Every
command goes through ``rlsched.cli.main`` in-process (``fuzz_kit.run_cli``) and is judged by
the same rules as ``test_fuzz_cli.py``: a failure is exit code 2 and one ``rlsched: error:``
line, no traceback, and ``--out`` is left as it was.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fuzz_kit import judge_cli, one_error, run_cli, with_meta

from rlsched.cluster.loop.assembly import Assembly
from rlsched.cluster.state import ClusterState

FAST = ("--steps", "2", "--gpus", "16", "--model", "none")


def write_trace(folder: Path, name: str = "tiny.jsonl", env: float = 0.5, turns: int = 2) -> Path:
    rows = [{"task_id": t, "trajectory_id": f"{t}{k}", "turn": turn, "prompt_tokens": 40,
             "output_tokens": 20, "env_seconds": env}
            for t in ("a", "b") for k in range(2) for turn in range(turns)]
    path = folder / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ------------------------------------------------- a policy spec given twice to compare


@pytest.mark.parametrize("args", [
    ["--policies", "colocated,colocated"],
    ["--policies", "colocated", "--policy", "colocated"],
    ["--policy", "async:staleness=1", "--policy", " async:staleness=1"],
], ids=["policies", "policies+policy", "spaces"])
def test_a_spec_given_twice_is_one_line(tmp_path, args):
    """Was an IndexError traceback from the report (it names two runs of one label
    'colocated #1'/'#2', then looked them up in compare's summary, which said 'colocated'
    twice) after both runs had been simulated; now refused before any run."""
    out = tmp_path / "out"
    err = one_error(["compare", "--trace", str(write_trace(tmp_path)), *FAST, *args,
                     "--out", str(out)])
    assert "given twice" in err
    assert not out.exists()


def test_a_spec_given_twice_in_the_config_is_one_line(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[[policy]]\nspec = "colocated"\n[[policy]]\nspec = "colocated"\n')
    err = one_error(["compare", "--trace", str(write_trace(tmp_path)), *FAST, "--config",
                     str(config), "--out", str(tmp_path / "out")])
    assert "'colocated' is given twice" in err


def test_distinct_specs_of_one_policy_still_compare(tmp_path):
    out = tmp_path / "out"
    res = run_cli(["compare", "--trace", str(write_trace(tmp_path)), *FAST, "--no-report",
                   "--policy", "async", "--policy", "async:staleness=2", "--out", str(out)])
    assert judge_cli(res, False) == "ok"
    import pandas as pd

    assert pd.read_csv(out / "summary.csv")["policy"].tolist() == ["async", "async:staleness=2"]


# ------------------------------------------------- config: trace = ""


@pytest.mark.parametrize("value", ['""', '"  "', "5"])
def test_config_trace_that_is_no_path_names_the_config(tmp_path, value):
    """``trace = ""`` resolved to the config's own folder: "'.': is a directory -- expected
    a trace file", naming neither the config nor its key."""
    config = tmp_path / "c.toml"
    config.write_text(f"trace = {value}\n")
    err = one_error(["compare", *FAST, "--policies", "colocated", "--config", str(config),
                     "--out", str(tmp_path / "out")])
    assert f"{config}: trace=" in err and "expected the path of a trace file" in err


# ------------------------------------------------- env_seconds near float's limit


@pytest.mark.parametrize("env", [1.5e308, 1e18, 1.0000001e9])
def test_absurd_env_seconds_are_refused(tmp_path, env):
    """1.5e308 s per turn summed to inf: "policy colocated stalled at t=infs ... the trainer
    holds 0 GPUs, below its floor: give it at least 8" (blaming the cluster); 1e18 s ran,
    its figures the noise of a clock whose resolution is 128 s."""
    trace = write_trace(tmp_path, env=env)
    err = one_error(["trace", "validate", str(trace)])
    assert "column env_seconds" in err and "at most 1e+09" in err
    out = tmp_path / "out"
    err = one_error(["compare", "--trace", str(trace), *FAST, "--policies", "colocated",
                     "--no-report", "--out", str(out)])
    assert "column env_seconds" in err
    assert not out.exists()


def test_env_seconds_at_the_bound_still_run(tmp_path):
    out = tmp_path / "out"
    res = run_cli(["compare", "--trace", str(write_trace(tmp_path, env=1e9)), *FAST,
                   "--policies", "colocated", "--no-report", "--out", str(out)])
    assert judge_cli(res, False) == "ok"


def test_import_estimates_a_duration_past_the_bound(tmp_path):
    """An imported tool call of 1e12 s (a damaged timestamp) is estimated like one that
    summed to inf, not a failure of the whole import."""
    import numpy as np

    from rlsched.traces.import_common import ImportedTrajectory, to_frame

    traj = ImportedTrajectory("t", "x", (5, 5), (3, 3), (1e12, 2.0), ("ls", "ls"), False)
    df = to_frame([traj], "words")
    assert df["env_estimated"].tolist() == [True, False]
    assert np.isfinite(df["env_seconds"]).all() and df["env_seconds"].max() <= 1e9


# ------------------------------------------------- many GPUs: engines assembled in one pass


def test_assembly_lands_many_gpus_in_linear_time():
    """Landing G GPUs filtered all G for each of the G/tp engines: a 2-step colocated run on
    65,536 GPUs took 93 s, on 16,384 7 s -- quadratic, hours at the 1,048,576 the run config
    allows. Now ``engine_of`` is asked once per GPU."""
    gpus = 4096
    st = ClusterState(gpus, 4, [], 0)
    calls = 0
    real = st.engine_of

    def counting(g: int) -> int:
        nonlocal calls
        calls += 1
        return real(g)

    st.engine_of = counting  # type: ignore[method-assign]
    formed = Assembly().land(st, tuple(range(gpus)), 1, 0, lambda g: None)
    assert [f.engine for f in formed] == list(range(gpus // 4))
    assert all(f.opens for f in formed)
    assert calls <= 2 * gpus


# ------------------------------------------------- run --policy A --policy B


def test_run_refuses_a_second_policy(tmp_path):
    """``run --policy colocated --policy async`` silently ran async alone (a plain option:
    the last one won), though compare's --policy repeats."""
    out = tmp_path / "out"
    err = one_error(["run", "--trace", str(write_trace(tmp_path)), *FAST, "--policy", "colocated",
                     "--policy", "async", "--out", str(out)])
    assert "run takes one --policy (got 2: colocated, async)" in err and "rlsched compare" in err
    assert not out.exists()


def test_run_with_one_policy_still_runs(tmp_path):
    out = tmp_path / "out"
    res = run_cli(["run", "--trace", str(write_trace(tmp_path)), *FAST, "--policy", "async",
                   "--out", str(out)])
    assert judge_cli(res, False) == "ok"
    assert [p.name for p in (out / "runs").iterdir()] == ["00-async"]


# ------------------------------------------------- cost show: its flags in its own words


def test_cost_show_seq_0_says_why_memory_is_not_modelled():
    """``--seq 0`` (the cost model's 'memory not modelled', as bench/regime_map.py uses it)
    printed a named preset's trainer as "memory not modelled (no preset)"."""
    res = run_cli(["cost", "show", "--model", "qwen2.5-32b", "--gpu", "h200", "--seq", "0"])
    assert judge_cli(res, False) == "ok"
    assert "memory not modelled (--seq 0)" in res.out and "no preset" not in res.out
    res = run_cli(["cost", "show", "--model", "none"])
    assert "memory not modelled (no preset)" in res.out


def test_cost_show_huge_tp_names_tp():
    """Was "run config: gpus=2000000: expected at most 1,048,576", a flag cost show has not."""
    err = one_error(["cost", "show", "--model", "qwen2.5-32b", "--gpu", "h200", "--tp", "1000000"])
    assert "--tp=1000000" in err and "gpus=" not in err


# ------------------------------------------------- trace gen --like X --out X


def test_trace_gen_like_refuses_to_overwrite_its_source(tmp_path):
    """The trace fitted to was silently replaced by the synthetic one (trace import refuses
    the same for its logs)."""
    like = write_trace(tmp_path)
    before = like.read_bytes()
    err = one_error(["trace", "gen", "--like", str(like), "--out", str(tmp_path / "." / like.name)])
    assert "is the --like trace" in err
    assert like.read_bytes() == before


# ------------------------------------------------- --config/--cost inside --out --force


def _inputs_inside(folder: Path) -> tuple[Path, Path]:
    folder.mkdir()
    config = folder / "cfg.toml"
    config.write_text("[cluster]\ngpus = 16\n[run]\nsteps = 2\n")
    cost = folder / "cost.json"
    cost.write_text('{"switch_s": 1.0}')
    return config, cost


@pytest.mark.parametrize("command", [
    ["compare", "--policies", "colocated", "--no-report"],
    ["run", "--policy", "colocated"],
    ["plan", "--no-sensitivity", "--no-report", "--workers", "1", "--trials", "1"],
], ids=["compare", "run", "plan"])
@pytest.mark.parametrize("which", ["--config", "--cost"])
def test_force_does_not_delete_the_config_or_cost_file_it_read(tmp_path, command, which):
    """Only the trace was guarded: ``--config OUT/recommended.toml --out OUT --force`` (the
    natural re-run of a plan) deleted the config it had just read, and a --cost file too."""
    out = tmp_path / "out"
    config, cost = _inputs_inside(out)
    given = config if which == "--config" else cost
    args = ["--config", str(config)] if which == "--config" else ["--cost", str(cost), "--gpus", "16",
                                                                  "--steps", "2"]
    err = one_error([*command, "--trace", str(write_trace(tmp_path)), "--model", "none", *args,
                     "--out", str(out), "--force"])
    assert f"holds the input {given}" in err
    assert config.exists() and cost.exists()


# ------------------------------------------------- plan --ray at an address nothing answers


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------- [live] values checked when the file is read


@pytest.mark.parametrize(("line", "expected"), [
    ("temperature = nan", "[live] temperature=nan: expected a finite number"),
    ("tool_seconds = inf", "[live] tool_seconds=inf: expected a finite number"),
    ('gpus = "two"', "[live] gpus='two': expected an integer"),
    ("temperature = -1", "[live] temperature=-1.0: expected >= 0"),
])
def test_live_values_are_checked_when_the_config_is_read(tmp_path, line, expected):
    """Only [live]'s keys were checked when a file was read: a wrong value rode through
    compare and plan (into recommended.toml) and failed only once run live -- and nan or inf
    (TOML writes both) passed even that (temperature = nan sampled with a NaN temperature)."""
    config = tmp_path / "c.toml"
    config.write_text(f"[live]\n{line}\n")
    err = one_error(["compare", "--trace", str(write_trace(tmp_path)), *FAST, "--policies",
                     "colocated", "--no-report", "--config", str(config), "--out", str(tmp_path / "o")])
    assert err == f"rlsched: error: {config}: {expected}"


def test_live_settings_refuse_non_finite_numbers():
    from rlsched.cluster.errors import ConfigError
    from rlsched.real.config import LiveSettings

    with pytest.raises(ConfigError, match=r"temperature=nan: expected a finite number"):
        LiveSettings.from_config({"temperature": float("nan")})
    assert LiveSettings.from_config({"temperature": 0.5}).temperature == 0.5


# ------------------------------------------------- JSON null named as JSON says it


@pytest.mark.parametrize(("fmt", "name", "text", "expected"), [
    ("mini-swe-agent", "t.traj.json", '{"messages": [null], "info": {}}', "messages[0] is a JSON null"),
    ("openhands", "o.jsonl", '{"instance_id": "x", "history": [null]}', "history[0] is a JSON null"),
    ("swe-agent", "t.traj", '{"trajectory": [null], "history": [], "info": {}}',
     "trajectory step 0 is a JSON null"),
    ("verl", "1.jsonl", '{"input": null, "output": "b", "score": 1}', "'input' is a JSON null"),
    ("messages", "m.jsonl", "null", "line 1: a JSON null"),
], ids=["mini-swe-agent", "openhands", "swe-agent", "verl", "messages"])
def test_import_names_a_json_null_null(tmp_path, fmt, name, text, expected):
    """The skip reasons said "a JSON NoneType", Python's name for JSON's null."""
    log = tmp_path / name
    log.write_text(text + "\n")
    err = one_error(["trace", "import", "--format", fmt, str(log), "--out", str(tmp_path / "t.jsonl")])
    assert expected in err and "NoneType" not in err


def test_trace_load_names_a_json_null_null(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"task_id": "a", "trajectory_id": "a", "turn": 0, "prompt_tokens": 1, '
                     '"output_tokens": 1, "env_seconds": 0}\nnull\n')
    err = one_error(["trace", "validate", str(trace)])
    assert "line 2: a JSON null" in err


# ------------------------------------------------- files that never end


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
@pytest.mark.parametrize("flag", ["--config", "--cost"])
def test_a_config_or_cost_file_that_never_ends_is_one_line(tmp_path, flag):
    """``--config /dev/zero`` (or --cost) read until memory ran out: a hang, then a crash."""
    extra = ["--gpus", "16", "--steps", "2"] if flag == "--cost" else []
    res = run_cli(["compare", "--trace", str(write_trace(tmp_path)), "--model", "none", flag,
                   "/dev/zero", *extra, "--policies", "colocated", "--out", str(tmp_path / "o")],
                  limit_s=30)
    assert judge_cli(res, True) == "clean error"
    assert "/dev/zero: more than 16 MiB" in res.err


def test_a_config_file_of_ordinary_size_still_reads(tmp_path):
    from rlsched.config import load_config

    config = tmp_path / "c.toml"
    config.write_text("# " + "x" * 100_000 + "\n[cluster]\ngpus = 16\n")
    assert load_config(config).run.gpus == 16


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_import_skips_a_device(tmp_path):
    """``trace import --format messages /dev/zero`` read until memory ran out."""
    res = run_cli(["trace", "import", "--format", "messages", "/dev/zero", "--out",
                   str(tmp_path / "t.jsonl")], limit_s=30)
    assert judge_cli(res, True) == "clean error"
    assert "/dev/zero: a device, not a log file" in res.err


# ------------------------------------------------- report: a run record's meta.json edited


@pytest.fixture(scope="module")
def one_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("run")
    out = folder / "out"
    res = run_cli(["compare", "--trace", str(write_trace(folder)), *FAST, "--policies", "colocated",
                   "--no-report", "--out", str(out)])
    assert judge_cli(res, False) == "ok"
    return out / "runs" / "00-colocated"


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("num_steps", "x", "field num_steps='x': expected an integer >= 0"),
    ("num_gpus", 10**12, "field num_gpus=1000000000000: expected at most 1,048,576"),
    ("complete", "no", "field complete='no': expected true or false"),
], ids=["num_steps", "num_gpus", "complete"])
def test_report_refuses_an_edited_meta_in_one_line(tmp_path, one_run, key, value, expected):
    """num_steps "x" was a ValueError traceback from the report's metrics; num_gpus 1e12
    "out of memory: the run is too large (fewer --gpus, --steps ...)", flags report has not;
    complete "no" was read as a complete run."""
    run = with_meta(one_run, tmp_path / "run", key, value)
    err = one_error(["report", str(run), "--out", str(tmp_path / "r")])
    assert err == f"rlsched: error: {run / 'meta.json'}: {expected}"
