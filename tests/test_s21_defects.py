"""Session 21: user-facing defects found by feeding odd inputs to the CLI, each pinned here.

1. ``rlsched report`` on a run record whose ``steps.parquet`` lists a version twice (a
   record concatenated or edited by hand) ended in a pandas traceback; steps whose times
   go backwards, or are NaN or negative, gave negative step seconds in step_times.csv and
   critical_path.csv with exit code 0; a trajectory listed twice was counted twice (or a
   traceback, by its index). ``rlsched fidelity`` read the same steps table unchecked.
2. ``trace import --format messages``: a negative duration was written as a recorded 0 s
   tool call instead of being estimated.
3. ``--samples-per-task`` above every group of the trace ran smaller groups while the
   config and meta.json recorded the larger number.
4. ``rlsched report OUT OUT/runs/01-x`` reported the run twice, as two tied runs.
5. ``trace import --tokenizer DIR`` with a tokenizer that cannot count text: a Rust
   traceback, or a trace of all-zero token counts.
6. ``trace import`` of one log reached twice imported its trajectories twice.
7. ``rlsched plan --config C`` ignored C's ``[[policy]]`` entries without a word.
8. A JSON line cut inside a string was "Unterminated string starting at at column N".
9. ``trace gen`` refused a bad flag naming ``GenParams.<field>``, not the flag.

Commands go through ``rlsched.cli.main`` in-process (``fuzz_kit.run_cli``) and are judged
by ``test_fuzz_cli.py``'s rules: a failure is exit code 2 and one ``rlsched: error:`` line.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fuzz_kit import judge_cli, one_error, run_cli

SMALL = ("--tasks-per-step", "2", "--gpus", "4", "--tp", "1", "--model", "none")


def write_rows(path: Path) -> Path:
    """A small trace: 6 tasks x 2 samples x 2 turns."""
    rows = [(f"t{t}", f"t{t}-{k}", turn, 30 + t, 10 + 3 * k, 0.5)
            for t in range(6) for k in range(2) for turn in range(2)]
    pd.DataFrame(rows, columns=["task_id", "trajectory_id", "turn", "prompt_tokens", "output_tokens",
                                "env_seconds"]).to_parquet(path)
    return path


def small_compare(folder: Path, steps: int, policies: str) -> Path:
    """``rlsched compare`` of ``policies`` for ``steps`` steps on :func:`write_rows`'s trace:
    its output folder."""
    out = folder / "out"
    res = run_cli(["compare", "--trace", str(write_rows(folder / "t.parquet")), *SMALL, "--steps", str(steps),
                   "--policies", policies, "--no-report", "--out", str(out)])
    assert judge_cli(res, False) == "ok", res.err
    return out


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory) -> Path:
    """One colocated run of three steps (the steps table has three rows)."""
    return small_compare(tmp_path_factory.mktemp("run"), 3, "colocated") / "runs" / "00-colocated"


def with_table(run: Path, dest: Path, table: str, edit: Callable[[pd.DataFrame], pd.DataFrame]) -> Path:
    """A copy of the run record ``run`` at ``dest`` with ``table``.parquet rewritten by
    ``edit`` (a record edited by hand, or two records' tables concatenated)."""
    shutil.copytree(run, dest)
    f = dest / f"{table}.parquet"
    edit(pd.read_parquet(f)).to_parquet(f, index=False)
    return dest


def _set(col: str, values: list[float]) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def edit(df: pd.DataFrame) -> pd.DataFrame:
        return df.assign(**{col: values})
    return edit


def _twice(df: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([df, df.iloc[:1]], ignore_index=True)


def _backwards(df: pd.DataFrame) -> pd.DataFrame:
    return df.assign(time=df["time"].to_numpy()[::-1])


# ------------------------------------------------------------ 1. the steps and trajectories tables


@pytest.mark.parametrize(("table", "edit", "expected"), [
    ("steps", _twice, "row 3: version=1 appears more than once: expected one row per version"),
    ("steps", _set("version", [0, 1, 2]),
     "row 0: version=0: expected a whole number >= 1 (the weights the step made)"),
    ("steps", _set("version", [1.5, 2, 3]),
     "row 0: version=1.5: expected a whole number >= 1 (the weights the step made)"),
    ("steps", _backwards, "row 1: version 2 ends at time={t1}, before version 1 at {t2}: expected steps "
                          "to end in version order"),
    ("steps", lambda df: df.assign(time=[df["time"][0], np.nan, df["time"][2]]),
     "row 1: time=nan: expected a finite number of seconds >= 0"),
    ("steps", lambda df: df.assign(time=[-5.0, df["time"][1], df["time"][2]]),
     "row 0: time=-5.0: expected a finite number of seconds >= 0"),
    ("trajectories", _twice, "row {n}: trajectory={first!r} appears more than once: expected one row per "
                             "trajectory"),
], ids=["version-twice", "version-0", "version-1.5", "time-backwards", "time-nan", "time-negative",
        "trajectory-twice"])
def test_report_refuses_an_impossible_table_row_in_one_line(tmp_path, three_steps, table, edit, expected):
    """A version listed twice was a pandas traceback (critical_path's reindex); times
    backwards, NaN or negative were step_times.csv rows of negative or empty seconds with
    exit code 0; a trajectory listed twice was counted twice."""
    steps = pd.read_parquet(three_steps / "steps.parquet")
    trajs = pd.read_parquet(three_steps / "trajectories.parquet")
    t = steps["time"].to_numpy()
    expected = expected.format(t1=f"{t[1]:g}", t2=f"{t[2]:g}", n=len(trajs), first=trajs["trajectory"][0])
    run = with_table(three_steps, tmp_path / "run", table, edit)
    err = one_error(["report", str(run), "--out", str(tmp_path / "r")])
    assert err == f"rlsched: error: {run / f'{table}.parquet'}: {expected}"


def test_steps_that_start_after_version_1_still_report(tmp_path, three_steps):
    """A resumed live run's record starts at its first new version: not refused."""
    run = with_table(three_steps, tmp_path / "run", "steps", _set("version", [4, 5, 6]))
    res = run_cli(["report", str(run), "--out", str(tmp_path / "r")])
    assert judge_cli(res, False) == "ok", res.err
    times = pd.read_csv(tmp_path / "r" / "step_times.csv")
    assert (times["seconds"].dropna() >= 0).all()


# ------------------------------------------------------------ 2. a negative duration in a transcript


def _transcript(tool: dict) -> dict:
    return {"id": "d", "messages": [
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "```\npytest -q\n```", "timestamp": 100.0},
        {"role": "tool", "content": "1 passed", **tool},
        {"role": "assistant", "content": "done"}]}


def import_one(tmp_path: Path, rec: dict) -> pd.DataFrame:
    """``rlsched trace import --format messages`` of one transcript line: the trace rows."""
    return import_one_with(tmp_path, rec)


def import_one_with(tmp_path: Path, rec: dict, *args: str) -> pd.DataFrame:
    """:func:`import_one` with more ``trace import`` arguments."""
    src, out = tmp_path / "log.jsonl", tmp_path / "t.parquet"
    src.write_text(json.dumps(rec) + "\n")
    res = run_cli(["trace", "import", "--format", "messages", str(src), "--out", str(out), *args])
    assert judge_cli(res, False) == "ok", res.err
    return pd.read_parquet(out)


def test_a_negative_duration_is_estimated_not_a_recorded_zero(tmp_path):
    """``"duration": -100`` on a tool message was written as a recorded 0 s tool call
    (``env_estimated`` false, and the import's summary counted it as recorded)."""
    df = import_one(tmp_path, _transcript({"duration": -100}))
    assert df["env_estimated"].tolist() == [True, False]
    assert df["env_seconds"][0] > 0


def test_a_negative_duration_falls_back_to_the_timestamps(tmp_path):
    df = import_one(tmp_path, _transcript({"duration": -1, "timestamp": 112.5}))
    assert df["env_estimated"].tolist() == [False, False]
    assert df["env_seconds"].tolist() == [12.5, 0.0]


def test_a_zero_duration_is_still_recorded(tmp_path):
    df = import_one(tmp_path, _transcript({"duration": 0}))
    assert df["env_estimated"].tolist() == [False, False]
    assert df["env_seconds"].tolist() == [0.0, 0.0]


# ------------------------------------------------------------ 3. samples_per_task above every group


@pytest.fixture(scope="module")
def uneven(tmp_path_factory) -> Path:
    """A trace whose tasks have 1, 2 and 3 trajectories (an imported log's groups)."""
    rows = [(f"t{t}", f"t{t}-{k}", 0, 20, 5 + k, 0.5) for t in range(3) for k in range(t + 1)]
    path = tmp_path_factory.mktemp("trace") / "uneven.parquet"
    pd.DataFrame(rows, columns=["task_id", "trajectory_id", "turn", "prompt_tokens", "output_tokens",
                                "env_seconds"]).to_parquet(path)
    return path


RUN_ARGS = ("--gpus", "4", "--tp", "1", "--model", "none", "--steps", "1")


@pytest.mark.parametrize("command", [
    ["compare", "--policies", "colocated", "--no-report"],
    ["run", "--policy", "colocated"],
    ["plan", "--trials", "1"],
])
def test_samples_per_task_above_every_group_is_refused(tmp_path, uneven, command):
    """``--samples-per-task 8`` on a trace of at most 3 trajectories per task ran groups of
    at most 3, exit code 0, while meta.json recorded samples_per_task 8."""
    out = tmp_path / "out"
    err = one_error([*command, "--trace", str(uneven), *RUN_ARGS, "--samples-per-task", "4",
                     "--out", str(out)])
    assert err == (f"rlsched: error: samples_per_task=4: the trace {uneven} has at most 3 trajectories "
                   "per task and a step replays each at most once; expected at most 3 (or leave it out: "
                   "every trajectory of a task)")
    assert not out.exists()


def test_samples_per_task_that_caps_some_groups_still_runs(tmp_path, uneven):
    res = run_cli(["compare", "--policies", "colocated", "--no-report", "--trace", str(uneven), *RUN_ARGS,
                   "--tasks-per-step", "3", "--samples-per-task", "2", "--out", str(tmp_path / "out")])
    assert judge_cli(res, False) == "ok", res.err
    trajs = pd.read_parquet(tmp_path / "out" / "runs" / "00-colocated" / "trajectories.parquet")
    assert sorted(trajs["trajectory"]) == ["t0-0", "t1-0", "t1-1", "t2-0", "t2-1"]


def test_a_streamed_trace_is_held_to_the_same_bound(uneven):
    """A Parquet trace too large to load whole is checked on its index, the same way."""
    from rlsched.cluster.errors import ConfigError
    from rlsched.sim.workload import replay_workload

    with pytest.raises(ConfigError, match=r"samples_per_task=4: .* at most 3 trajectories per task"):
        replay_workload(uneven, 1, None, 4, stream_rows=0)
    _, batches = replay_workload(uneven, 1, None, 3, stream_rows=0)
    assert len(batches[0]) == 6


# ------------------------------------------------------------ 4. one run given twice to report


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> Path:
    """A compare output folder of two runs (colocated, elastic)."""
    return small_compare(tmp_path_factory.mktemp("cmp"), 1, "colocated,elastic")


def test_report_refuses_a_run_reached_twice(tmp_path, two_runs):
    """``rlsched report OUT OUT/runs/01-elastic`` reported elastic twice, as two runs
    ('elastic [01-elastic] #2' and '#3') tied in every table, with exit code 0."""
    run = two_runs / "runs" / "01-elastic"
    err = one_error(["report", str(two_runs), str(run), "--out", str(tmp_path / "r")])
    assert err == (f"rlsched: error: {run}: the same run given twice (through {two_runs}, then as {run}): "
                   "expected each run once")
    err = one_error(["report", str(run), f"{run}/", "--out", str(tmp_path / "r")])
    assert err == (f"rlsched: error: {run}: the same run given twice (as {run}, then as {run}): "
                   "expected each run once")
    assert not (tmp_path / "r").exists()


def test_report_of_distinct_runs_still_works(tmp_path, two_runs):
    runs = two_runs / "runs"
    res = run_cli(["report", str(runs / "00-colocated"), str(runs / "01-elastic"), "--out", str(tmp_path / "r")])
    assert judge_cli(res, False) == "ok", res.err
    assert pd.read_csv(tmp_path / "r" / "summary.csv")["policy"].tolist() == ["colocated", "elastic"]


# ------------------------------------------------------------ 5. a --tokenizer that cannot count


def _word_level(folder: Path, vocab: dict[str, int], unk: str) -> Path:
    """A word-level tokenizer.json with ``vocab`` and the unknown token ``unk`` (which the
    vocabulary may lack: a hand-edited or half-converted tokenizer)."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token=unk))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    return folder


def _bpe_without_vocab(folder: Path) -> Path:
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(
        {"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}))
    return folder


@pytest.mark.parametrize(("make", "expected"), [
    (lambda d: _word_level(d, {"hi": 0, "x": 1}, "[UNK]"),
     "the tokenizer fails on \"def main(): print('Hello, world!')  ... (WordLevel error: Missing [UNK] "
     "token from the vocabulary) — expected a tokenizer that encodes any text"),
    (_bpe_without_vocab,
     "the tokenizer encodes \"def main(): print('Hello, world!')  # 42\" as no tokens — expected a "
     "tokenizer that counts text (its vocabulary is empty, or it drops what it does not know)"),
], ids=["unk-not-in-vocab", "empty-vocab"])
def test_a_tokenizer_that_cannot_count_is_refused_in_one_line(tmp_path, make, expected):
    """An unknown token missing from the vocabulary was a Rust ``Exception`` traceback; an
    empty vocabulary imported every turn as 0 prompt and 0 output tokens, exit code 0."""
    folder = make(tmp_path / "tok")
    src = tmp_path / "log.jsonl"
    src.write_text(json.dumps(_transcript({"duration": 1.0})) + "\n")
    out = tmp_path / "t.parquet"
    err = one_error(["trace", "import", "--format", "messages", str(src), "--out", str(out),
                     "--tokenizer", str(folder)])
    assert err == f"rlsched: error: {folder / 'tokenizer.json'}: {expected}"
    assert not out.exists()


def test_a_tokenizer_with_its_unknown_token_still_counts(tmp_path):
    folder = _word_level(tmp_path / "tok", {"[UNK]": 0, "pytest": 1}, "[UNK]")
    df = import_one_with(tmp_path, _transcript({"duration": 1.0}), "--tokenizer", str(folder))
    assert (df["output_tokens"] > 0).all() and set(df["token_source"]) == {"tokenizer:tok"}


# ------------------------------------------------------------ 6. one log reached twice by an import


@pytest.mark.parametrize(("args", "reason"), [
    (["log.jsonl", "log.jsonl"], "log.jsonl: reached twice"),
    (["logs", "logs/log.jsonl"], "logs/log.jsonl: reached twice"),
    (["logs/log.jsonl", "alias.jsonl"], "alias.jsonl: the same file as logs/log.jsonl"),
], ids=["named-twice", "folder-and-file", "symlink"])
def test_a_log_reached_twice_is_imported_once(tmp_path, monkeypatch, args, reason):
    """A log given twice (or as a folder and a file in it, or through a symlink) was
    imported twice: every trajectory again as ``<id>#2``, its groups doubled, exit 0."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "logs").mkdir()
    line = json.dumps(_transcript({"duration": 1.0})) + "\n"
    (tmp_path / "logs" / "log.jsonl").write_text(line)
    (tmp_path / "log.jsonl").write_text(line)
    (tmp_path / "alias.jsonl").symlink_to(tmp_path / "logs" / "log.jsonl")
    res = run_cli(["trace", "import", "--format", "messages", *args, "--out", "t.parquet"])
    assert judge_cli(res, False) == "ok", res.err
    assert f"  skipped {reason}, already imported — expected each log once" in res.out.splitlines()
    assert pd.read_parquet(tmp_path / "t.parquet")["trajectory_id"].tolist() == ["d", "d"]  # 2 turns, 1 run


def test_fidelity_refuses_steps_that_end_out_of_order(tmp_path, three_steps):
    """``rlsched fidelity`` read the same steps table unchecked: times that went backwards
    were negative live_seconds and abs_error_pct in fidelity.csv, exit code 0. (A simulated
    record with ``driver`` set to live stands for a live one: fidelity reads the same files.)"""
    run = with_table(three_steps, tmp_path / "live", "steps", _backwards)
    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, "driver": "live"}))
    t = pd.read_parquet(three_steps / "steps.parquet")["time"].to_numpy()
    expected = (f"rlsched: error: {run / 'steps.parquet'}: row 1: version 2 ends at time={t[1]:g}, before "
                f"version 1 at {t[2]:g}: expected steps to end in version order")
    assert one_error(["fidelity", str(run), "--out", str(tmp_path / "f")]) == expected
    good = with_table(three_steps, tmp_path / "good", "steps", lambda df: df)
    (good / "meta.json").write_text(json.dumps({**meta, "driver": "live"}))
    assert one_error(["fidelity", str(good), "--repeat", str(run), "--out", str(tmp_path / "f")]) == expected
    res = run_cli(["fidelity", str(good), "--out", str(tmp_path / "f")])
    assert judge_cli(res, False) == "ok", res.err
    assert (pd.read_csv(tmp_path / "f" / "fidelity.csv")["live_seconds"] > 0).all()


# ------------------------------------------------------------ 7. plan and a config's [[policy]] entries

PLAN_FAST = ("--trials", "1", "--no-sensitivity", "--no-report", "--resamples", "1", "--top", "1",
             "--policies", "colocated")


@pytest.mark.parametrize(("entries", "warned"), [
    ('[[policy]]\nspec = "async:staleness=1"\n', "(async:staleness=1)"),
    ("", None),
], ids=["with-policy", "without"])
def test_plan_says_it_does_not_use_the_configs_policies(tmp_path, uneven, entries, warned):
    """``rlsched plan --config C`` ignored C's ``[[policy]]`` entries without a word (a
    config written for compare: the user expects those policies planned)."""
    config = tmp_path / "c.toml"
    config.write_text(f"[run]\nsteps = 1\n{entries}")
    res = run_cli(["plan", "--trace", str(uneven), "--config", str(config), "--gpus", "4", "--tp", "1",
                   "--model", "none", *PLAN_FAST, "--out", str(tmp_path / "p")])
    assert judge_cli(res, False) == "ok", res.err
    lines = [ln for ln in res.err.splitlines() if ln.startswith("rlsched: warning: ")]
    if warned is None:
        assert lines == []
    else:
        assert lines == [f"rlsched: warning: {config}: plan does not use its [[policy]] entries {warned}; it "
                         "searches every policy's parameters -- --policies NAMES limits the search"]


# ------------------------------------------------------------ 8. "starting at at column"


def test_a_cut_json_string_is_said_once(tmp_path):
    """A line cut inside a string read "Unterminated string starting at at column 16"
    (Python's message ends in "at"; the line then says where in its own words)."""
    trace = tmp_path / "cut.jsonl"
    trace.write_text('{"task_id":"A","traj')
    assert one_error(["trace", "validate", str(trace)]) == (
        f"rlsched: error: {trace}: line 1: Unterminated string starting at column 16 — expected one "
        "JSON object per line")
    log = tmp_path / "log.jsonl"
    log.write_text('{"messages":[{"role":"user","content":"hi\n')
    err = one_error(["trace", "import", "--format", "messages", str(log), "--out", str(tmp_path / "t.parquet")])
    assert "invalid JSON: Unterminated string starting at column 39 — expected" in err


# ------------------------------------------------------------ 9. trace gen names the flag


@pytest.mark.parametrize(("args", "expected"), [
    (["--tasks", "0"], "--tasks=0: expected a whole number >= 1"),
    (["--samples", "-2"], "--samples=-2: expected a whole number >= 1"),
    (["--turns-scale", "0"], "--turns-scale=0.0: expected a finite number > 0"),
    (["--tokens-scale", "nan"], "--tokens-scale=nan: expected a finite number > 0"),
    (["--growth", "inf"], "--growth=inf: expected a finite number > 0"),
], ids=["tasks", "samples", "turns-scale", "tokens-scale", "growth"])
def test_trace_gen_names_the_flag_the_user_typed(tmp_path, args, expected):
    """Each was refused as ``GenParams.tasks=0 — ...``: the generator's parameter record,
    a name ``rlsched trace gen --help`` never shows."""
    out = tmp_path / "g.jsonl"
    assert one_error(["trace", "gen", "--out", str(out), *args]) == f"rlsched: error: {expected}"
    assert not out.exists()
