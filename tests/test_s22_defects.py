"""Session 22: user-facing defects found by feeding odd inputs to the CLI, each pinned here.

1. ``rlsched calibrate --out cost.toml`` where a sidecar it writes (``cost.measurements.csv``,
   ``cost.info.json``) is a folder: a traceback after ``cost.toml`` alone was written, and
   a live calibration checked its ``--out`` only after minutes of measuring.
2. ``trace import -f messages logs/ -o logs/sub/b.jsonl``: a log the import found in the
   folder given was read, then overwritten with the trace (exit code 0); the guard only
   compared ``--out`` with the paths as typed. An ``--out`` that is a folder was found
   only after every log had been read and counted.
3. ``rlsched plan --no-sensitivity`` wrote ``sensitivity.csv`` and ``sensitivity_detail.csv``
   as one blank line (no header: ``pd.read_csv`` fails with "No columns to parse from
   file") and named the first among its outputs; when the first scenario was skipped the
   columns came in another order and ``candidates`` became floats (``3.0``).
4. ``compare --policies colocated --policies async`` ran async alone, and ``plan`` searched
   only the last ``--policies``: the first was dropped without a word (``--policy``
   repeats; ``run`` refuses a second ``--policy`` since session 19).
5. ``trace gen --seed -1`` was refused as ``generate_trace: seed=-1`` (``fit_trace: ...``
   with ``--like``) and ``--tokens-scale 1e300`` as ``GenParams.tokens_scale=...``: names
   ``--help`` never shows (session 21 mended the flags checked before generating only).
6. ``cost show --seq -1`` was refused as ``cost model: train_seq_tokens=-1.0: must be > 0``:
   a field the command's help never names, and "> 0" though ``--seq 0`` is accepted.
7. ``rlsched fidelity RUN --repeat RUN`` (the live run itself) printed "live spread median
   0.0%", and ``--repeat`` a simulated run gave the spread between a simulation and the
   live run; both written as the run-to-run spread, exit code 0.
8. A ``[[faults.fault]]`` tool fault naming a trajectory the run never replays (a typo, or
   an id of a step it does not reach) armed a hang that could never fire; the run
   succeeded and summary.csv counted it among its faults (``faults = 1``).
9. ``--cost recommended.toml`` (a run config given as the cost file: both are TOML with a
   ``[cost]`` table) read its ``[cost]`` alone; the run went ahead on the default cluster,
   steps and trace, the config's [cluster], [run], trace and [[policy]] silently ignored.
10. ``--model none --gpu h200`` was refused as "--model/--gpu (or <defaults> [cost]
    model/gpu) 'none' is the flat historic cost model ...": it named no file (there was no
    config) and not which of the two was 'none'.

Commands go through ``rlsched.cli.main`` in-process (``fuzz_kit.run_cli``) and are judged
by ``test_fuzz_cli.py``'s rules: a failure is exit code 2 and one ``rlsched: error:`` line.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from fuzz_kit import judge_cli, one_error, run_cli


# ------------------------------------------------------------------ 1. calibrate's sidecars
@pytest.fixture()
def measurements(tmp_path: Path) -> Path:
    """An earlier calibration's ``a.measurements.csv`` (with its ``a.info.json``)."""
    from test_calibrate_fit import TINY, fake_rows, truth_model

    from rlsched.calibration import fit_measurements
    from rlsched.calibration_io import write_calibration

    info = {"model_dir": "tiny", "on_gpus": False, "gpus": 2, "tp": 1, "seconds": 1.0,
            "machine_peaks": {"peak_flops": TINY["peak_flops"], "hbm_bw": TINY["hbm_bw"]},
            "base": dict(TINY)}
    write_calibration(tmp_path / "cal" / "a.toml", fit_measurements(fake_rows(truth_model()), info))
    return tmp_path / "cal" / "a.measurements.csv"


@pytest.mark.parametrize("taken", ["b.measurements.csv", "b.info.json", "b.predictions.csv"])
def test_calibrate_refuses_an_out_whose_sidecar_is_a_folder(measurements, tmp_path, taken):
    out = tmp_path / "w"
    (out / taken).mkdir(parents=True)
    err = one_error(["calibrate", "--from-measurements", str(measurements), "--out", str(out / "b.toml")])
    assert f"would write {taken}, which is a directory there" in err
    assert sorted(p.name for p in out.iterdir()) == [taken]  # (b.toml was written before)


def test_calibrate_checks_its_out_before_measuring(tmp_path, monkeypatch):
    """Without --from-measurements the live backend measures for minutes: a bad --out is
    refused before it starts (the backend is not imported at all here)."""
    (tmp_path / "b.info.json").mkdir()
    import rlsched.calibration as calibration

    monkeypatch.setattr(calibration, "fit_measurements", lambda *a: pytest.fail("measured"))
    err = one_error(["calibrate", "--out", str(tmp_path / "b.toml")])
    assert "would write b.info.json, which is a directory there" in err


def test_calibrate_write_failure_is_one_line_and_leaves_nothing(measurements, tmp_path, monkeypatch):
    def full_disk(self, path, *args, **kwargs):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(pd.DataFrame, "to_csv", full_disk)
    out = tmp_path / "w"
    out.mkdir()
    err = one_error(["calibrate", "--from-measurements", str(measurements), "--out", str(out / "b.toml")])
    assert "No space left on device" in err and "--out" in err
    assert list(out.iterdir()) == []  # no cost.toml without its sidecars, no .part files


def test_calibrate_refit_still_writes_all_four_files(measurements, tmp_path):
    res = run_cli(["calibrate", "--from-measurements", str(measurements), "--out", str(tmp_path / "b.toml")])
    assert judge_cli(res, False) == "ok", res.err
    assert sorted(p.name for p in tmp_path.glob("b.*")) == [
        "b.info.json", "b.measurements.csv", "b.predictions.csv", "b.toml"]


# ------------------------------------------------------- 2. trace import over a log it reads
MESSAGES = Path(__file__).parent / "fixtures" / "import" / "messages.jsonl"


@pytest.fixture()
def logs(tmp_path: Path) -> Path:
    """A folder of two chat-transcript logs, one in a subfolder."""
    (tmp_path / "logs" / "sub").mkdir(parents=True)
    for name in ("a.jsonl", "sub/b.jsonl"):
        (tmp_path / "logs" / name).write_bytes(MESSAGES.read_bytes())
    return tmp_path / "logs"


@pytest.mark.parametrize("name", ["a.jsonl", "sub/b.jsonl"])
def test_import_refuses_an_out_that_is_a_log_in_a_folder_given(logs, name):
    target = logs / name
    err = one_error(["trace", "import", "-f", "messages", str(logs), "-o", str(target)])
    assert err == (f"rlsched: error: --out {target}: is a log under {logs} being imported, which writing "
                   "the trace would overwrite; give a file name outside that folder")
    assert target.read_bytes() == MESSAGES.read_bytes()


def test_import_into_the_folder_under_a_name_it_does_not_read_still_works(logs):
    for out in (logs / "trace.parquet", logs / "new.jsonl"):
        res = run_cli(["trace", "import", "-f", "messages", str(logs), "-o", str(out)])
        assert judge_cli(res, False) == "ok", res.err
        assert out.is_file()
    # another format's logs are not read: its suffix decides
    res = run_cli(["trace", "import", "-f", "swe-agent", str(logs), "-o", str(logs / "a.jsonl")])
    assert "a directory with no .traj files" in res.err
    assert (logs / "a.jsonl").read_bytes() == MESSAGES.read_bytes()


def test_import_refuses_a_folder_as_out_before_reading(logs, tmp_path, monkeypatch):
    (tmp_path / "x.parquet").mkdir()
    import rlsched.cli.trace_import as cli_import

    monkeypatch.setattr(cli_import, "import_traces", lambda *a, **k: pytest.fail("read the logs"))
    err = one_error(["trace", "import", "-f", "messages", str(logs), "-o", str(tmp_path / "x.parquet")])
    assert "cannot write the trace (Is a directory)" in err


# -------------------------------------------------- 3. plan's sensitivity tables, always CSV
def _plan_trace(tmp_path: Path) -> Path:
    from rlsched.traces import generate_trace, write_trace

    return write_trace(generate_trace("uniform", seed=0, tasks=8, samples=2), tmp_path / "u.parquet")


def test_plan_without_sensitivity_writes_readable_empty_tables(tmp_path):
    from rlsched.plan.checks import SENSITIVITY_COLUMNS, SENSITIVITY_DETAIL_COLUMNS

    out = tmp_path / "plan"
    res = run_cli(["plan", "--trace", str(_plan_trace(tmp_path)), "--gpus", "16", "--tp", "4", "--steps", "2",
                   "--trials", "2", "--workers", "1", "--resamples", "1", "--top", "1",
                   "--no-sensitivity", "--no-report", "--out", str(out)], limit_s=300)
    assert judge_cli(res, False) == "ok", res.err
    for name, columns in (("sensitivity.csv", SENSITIVITY_COLUMNS),
                          ("sensitivity_detail.csv", SENSITIVITY_DETAIL_COLUMNS)):
        table = pd.read_csv(out / name)
        assert list(table.columns) == list(columns) and table.empty


def test_sensitivity_columns_do_not_depend_on_a_skipped_first_scenario(tmp_path):
    """12 GPUs of tp 4: the half-size cluster (6) is skipped, and its row comes first."""
    from rlsched.plan.checks import SENSITIVITY_COLUMNS

    out = tmp_path / "plan"
    res = run_cli(["plan", "--trace", str(_plan_trace(tmp_path)), "--gpus", "12", "--tp", "4", "--steps", "2",
                   "--trials", "2", "--workers", "1", "--resamples", "1", "--top", "1",
                   "--no-report", "--out", str(out)], limit_s=300)
    assert judge_cli(res, False) == "ok", res.err
    lines = (out / "sensitivity.csv").read_text().splitlines()
    assert lines[0] == ",".join(SENSITIVITY_COLUMNS)
    assert "skipped" in lines[1] and lines[2].endswith(",3,none")  # (not 3.0)


# ------------------------------------------------------------- 4. --policies given twice
def _small_trace(tmp_path: Path) -> Path:
    rows = [(f"t{t}", f"t{t}-{k}", turn, 30 + t, 10 + 3 * k, 0.5)
            for t in range(4) for k in range(2) for turn in range(2)]
    path = tmp_path / "t.parquet"
    pd.DataFrame(rows, columns=["task_id", "trajectory_id", "turn", "prompt_tokens", "output_tokens",
                                "env_seconds"]).to_parquet(path)
    return path


SMALL = ("--tasks-per-step", "2", "--gpus", "4", "--tp", "1", "--model", "none", "--steps", "1")


def test_compare_runs_every_policies_list_given(tmp_path):
    out = tmp_path / "out"
    res = run_cli(["compare", "--trace", str(_small_trace(tmp_path)), *SMALL, "--no-report",
                   "--policies", "colocated", "--policies", "async,elastic", "--out", str(out)])
    assert judge_cli(res, False) == "ok", res.err
    assert pd.read_csv(out / "summary.csv")["policy"].tolist() == ["colocated", "async", "elastic"]


def test_compare_refuses_a_name_repeated_across_policies_lists(tmp_path):
    err = one_error(["compare", "--trace", str(_small_trace(tmp_path)), *SMALL, "--no-report",
                     "--policies", "colocated", "--policies", "colocated", "--out", str(tmp_path / "o")])
    assert "policy 'colocated' is given twice" in err
    err = one_error(["compare", "--trace", str(_small_trace(tmp_path)), *SMALL, "--no-report",
                     "--policies", "colocated", "--policies", "", "--out", str(tmp_path / "o")])
    assert err == "rlsched: error: --policies '': empty name in the list"


def test_plan_searches_every_policies_list_given(tmp_path):
    import json

    out = tmp_path / "plan"
    res = run_cli(["plan", "--trace", str(_plan_trace(tmp_path)), "--gpus", "16", "--tp", "4", "--steps", "1",
                   "--trials", "2", "--workers", "1", "--resamples", "1", "--top", "1", "--no-sensitivity",
                   "--no-report", "--policies", "colocated", "--policies", "elastic", "--out", str(out)],
                  limit_s=300)
    assert judge_cli(res, False) == "ok", res.err
    arms = json.loads((out / "plan.json").read_text())["arms"]
    assert "colocated" in arms and any(a.startswith("elastic") for a in arms)
    err = one_error(["plan", "--trace", str(_plan_trace(tmp_path)), "--policies", "colocated",
                     "--policies", "async:staleness=1", "--out", str(tmp_path / "p2")])
    assert err == ("rlsched: error: --policies 'async:staleness=1': expected plain policy names, "
                   "e.g. async,elastic")


# ------------------------------------------------------------ 5. trace gen names the flag
@pytest.mark.parametrize(("args", "expected"), [
    (["--seed", "-1"], "--seed=-1: expected a whole number >= 0"),
    (["--seed", "-2", "--like", "LIKE"], "--seed=-2: expected a whole number >= 0"),
    (["--tokens-scale", "1e300"], "--tokens-scale=1e+300: token counts would reach 8.21e+303: "
                                  "expected a scale that keeps them below 2**62"),
], ids=["seed", "seed-like", "tokens-scale-overflow"])
def test_trace_gen_names_the_flag_of_a_late_refusal(tmp_path, args, expected):
    like = _small_trace(tmp_path)
    out = tmp_path / "g.jsonl"
    args = [str(like) if a == "LIKE" else a for a in args]
    assert one_error(["trace", "gen", "--out", str(out), *args]) == f"rlsched: error: {expected}"
    assert not out.exists()


# -------------------------------------------------------------- 6. cost show --seq names it
@pytest.mark.parametrize("value", ["-1", "nan", "inf", "0.5", "1e300"])
def test_cost_show_seq_refusal_names_the_flag(value):
    err = one_error(["cost", "show", "--seq", value])
    assert err == (f"rlsched: error: --seq={float(value)!r}: expected 0 (trainer memory not modelled) "
                   "or a sequence length in tokens from 1 to 1e+09")


def test_cost_show_seq_bounds_are_the_cost_models():
    """The flag's bounds are the cost model's own: both ends still reach it."""
    from dataclasses import replace

    from rlsched.cli.cost import MAX_SEQ_TOKENS
    from rlsched.cluster.errors import ConfigError
    from rlsched.sim.cost import CostModel

    for ok in (0.0, 1.0, MAX_SEQ_TOKENS):
        replace(CostModel(), train_seq_tokens=ok)
    for bad in (0.5, MAX_SEQ_TOKENS * 1.001):
        with pytest.raises(ConfigError):
            replace(CostModel(), train_seq_tokens=bad)
    res = run_cli(["cost", "show", "--model", "none", "--seq", "1"])
    assert judge_cli(res, False) == "ok", res.err


# ----------------------------------------------------- 7. fidelity --repeat: another live run
@pytest.fixture()
def live_run(tmp_path: Path) -> Path:
    """A simulated run dressed as a live one (``test_fidelity.fake_live_run``)."""
    from test_fidelity import fake_live_run

    return fake_live_run(tmp_path / "live")


@pytest.mark.parametrize("spelling", ["same", "trailing-slash"])
def test_fidelity_refuses_the_live_run_as_its_own_repeat(live_run, tmp_path, spelling):
    repeat = str(live_run) + ("/" if spelling == "trailing-slash" else "")
    err = one_error(["fidelity", str(live_run), "--repeat", repeat, "--out", str(tmp_path / "f")])
    assert err.endswith(": is the live run itself; expected a second live run of the same config "
                        "(its run-to-run spread)")
    assert not (tmp_path / "f").exists()


def test_fidelity_refuses_a_simulated_run_as_repeat(live_run, tmp_path):
    import json
    import shutil

    sim = tmp_path / "sim"
    shutil.copytree(live_run, sim)
    meta = json.loads((sim / "meta.json").read_text())
    (sim / "meta.json").write_text(json.dumps({**meta, "driver": "sim"}))
    err = one_error(["fidelity", str(live_run), "--repeat", str(sim), "--out", str(tmp_path / "f")])
    assert err == (f"rlsched: error: --repeat {sim}: meta.driver is 'sim'; expected a second live run of "
                   "the same config (rlsched run --live)")


def test_fidelity_still_takes_a_second_live_run(live_run, tmp_path):
    import shutil

    shutil.copytree(live_run, tmp_path / "again")
    res = run_cli(["fidelity", str(live_run), "--repeat", str(tmp_path / "again"), "--out", str(tmp_path / "f")])
    assert judge_cli(res, False) == "ok", res.err
    assert "spread_pct" in pd.read_csv(tmp_path / "f" / "fidelity.csv")


# ------------------------------------------------- 8. a tool fault for no trajectory of the run
def _fault_config(tmp_path: Path, trajectory: str) -> Path:
    config = tmp_path / "faults.toml"
    config.write_text(f'[[faults.fault]]\nkind = "tool"\nat = 0.0\ntrajectory = "{trajectory}"\n')
    return config


@pytest.mark.parametrize("target", ["nosuch", "t3-0"], ids=["typo", "a-step-not-replayed"])
def test_tool_fault_for_a_trajectory_the_run_never_replays_is_refused(tmp_path, target):
    """``t3-0`` is in the trace, but one step of two tasks replays t0 and t1 only."""
    out = tmp_path / "out"
    err = one_error(["compare", "--trace", str(_small_trace(tmp_path)), *SMALL, "--no-report",
                     "--policies", "colocated,async", "--config", str(_fault_config(tmp_path, target)),
                     "--out", str(out)])
    assert err == (f"rlsched: error: faults: fault 'tool' at=0: trajectory={target!r}: not a trajectory "
                   "this run replays (4 of them, e.g. 't0-0'); expected the id of one it replays")
    assert not out.exists()


def test_tool_fault_for_a_replayed_trajectory_still_fires(tmp_path):
    out = tmp_path / "out"
    res = run_cli(["compare", "--trace", str(_small_trace(tmp_path)), *SMALL, "--no-report",
                   "--policies", "colocated", "--config", str(_fault_config(tmp_path, "t1-1")),
                   "--out", str(out)])
    assert judge_cli(res, False) == "ok", res.err
    row = pd.read_csv(out / "summary.csv").iloc[0]
    assert row["faults"] == 1 and row["fault_tool_seconds_lost"] > 0


# -------------------------------------------------------- 9. a run config given as --cost
def test_a_run_config_given_as_cost_is_refused(tmp_path):
    config = tmp_path / "recommended.toml"
    config.write_text('trace = "t.parquet"\n\n[cluster]\ngpus = 4\ntp = 1\n\n[cost]\nsync_bw = 2.5e10\n'
                      '\n[[policy]]\nspec = "colocated"\n')
    out = tmp_path / "out"
    err = one_error(["compare", "--trace", str(_small_trace(tmp_path)), "--cost", str(config),
                     "--policies", "colocated", "--no-report", "--out", str(out)])
    assert err == (f"rlsched: error: {config}: holds cluster, policy, trace beside [cost]: a run config? "
                   "give it as --config (a cost-model file holds [cost] and [calibration] only)")
    assert not out.exists()


def test_a_calibrated_cost_file_and_a_bare_table_still_load(measurements, tmp_path):
    from rlsched.sim.cost import CostModel

    cal = measurements.with_name("a.toml")
    assert "[calibration]" in cal.read_text()
    CostModel.from_file(cal)
    bare = tmp_path / "bare.json"
    bare.write_text('{"sync_bw": 2.5e10}')
    assert CostModel.from_file(bare).sync_bw == 2.5e10


# ---------------------------------------------- 10. --model none with a GPU: which one, where
@pytest.mark.parametrize(("args", "config", "expected"), [
    (["--model", "none", "--gpu", "h200"], None,
     "--model 'none' is the flat historic cost model, which takes no preset; drop 'h200' (--gpu) "
     "or name both a model and a GPU"),
    (["--gpu", "h100"], '[cost]\nmodel = "none"\n',
     "CONFIG [cost] model 'none' is the flat historic cost model, which takes no preset; drop "
     "'h100' (--gpu) or name both a model and a GPU"),
], ids=["flags", "config-and-flag"])
def test_flat_model_with_a_gpu_names_where_each_came_from(tmp_path, args, config, expected):
    extra: list[str] = []
    if config is not None:
        (tmp_path / "c.toml").write_text(config)
        extra = ["--config", str(tmp_path / "c.toml")]
        expected = expected.replace("CONFIG", str(tmp_path / "c.toml"))
    assert one_error(["cost", "show", *args, *extra]) == f"rlsched: error: {expected}"


# ------------------------------------------- 11. a calibrated cost file given as --config
def test_a_cost_file_given_as_config_says_to_give_it_as_cost(measurements):
    """Was: "unknown section 'calibration'" and nothing on where such a file goes."""
    err = one_error(["compare", "--config", str(measurements.with_name("a.toml")), "--out",
                     str(measurements.parent / "out")])
    assert err == (f"rlsched: error: {measurements.with_name('a.toml')}: unknown section 'calibration': a "
                   "cost-model file from `rlsched calibrate`? give it as --cost")
