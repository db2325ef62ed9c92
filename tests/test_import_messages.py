"""Chat-transcript JSONL import: exact rows for OpenAI, content-part, ShareGPT and
role/text records; timing, estimates, rewards, truncation; bad lines skipped."""

from __future__ import annotations

import json

import numpy as np
import pytest
from importkit import MESSAGES, SWE, FakeWordCounter

from rlsched.cluster.errors import TraceError
from rlsched.traces.import_messages import read_file, read_record
from rlsched.traces.importers import import_traces

WORDS = FakeWordCounter()


@pytest.fixture(scope="module")
def imported():
    return import_traces("messages", [MESSAGES], tokenizer=WORDS)


def rows(df, tid):
    return df[df["trajectory_id"] == tid]


def test_openai_tool_calls_with_recorded_execution_time(imported):
    # Turn 0: tools schema (5 words) + system (7) + user (6); outputs add the tool name and
    # its JSON arguments; env seconds are the tool messages' execution_time; the final
    # answer ran nothing (0 s, recorded).
    r = rows(imported.df, "django-11099-s0")
    assert r["task_id"].unique().tolist() == ["django__django-11099"]
    assert r["prompt_tokens"].tolist() == [18, 3, 5, 2]
    assert r["output_tokens"].tolist() == [11, 9, 10, 7]
    assert r["env_seconds"].tolist() == [0.8, 0.1, 30.5, 0.0]
    assert not r["env_estimated"].any() and not r["truncated"].any()
    assert (r["reward"] == 1.0).all()


def test_content_parts_reasoning_and_estimated_env(imported):
    # Content parts are joined (the image part counts nothing); reasoning_content counts
    # as output; no timing, so both turns' env time is estimated.
    r = rows(imported.df, "django-11099-s1")
    assert r["prompt_tokens"].tolist() == [9, 5]
    assert r["output_tokens"].tolist() == [7, 16]
    assert r["env_estimated"].all() and (r["env_seconds"] > 0).all()
    assert r["truncated"].all()  # submitted (exit_context)
    assert (r["reward"] == 0.0).all()


def test_sharegpt_with_timestamps(imported):
    r = rows(imported.df, "sharegpt-7")
    assert r["task_id"].unique().tolist() == ["sharegpt-7"]
    assert r["prompt_tokens"].tolist() == [11, 2]
    assert r["output_tokens"].tolist() == [9, 5]
    assert r["env_seconds"].tolist() == [2.5, 0.0]  # 10:30:00 -> 10:30:02.5
    assert not r["env_estimated"].any()
    assert r["reward"].isna().all()


def test_role_text_trajectory_with_system_prompt_field(imported):
    r = rows(imported.df, "messages:4")  # no id field: <file stem>:<line>
    assert r["task_id"].unique().tolist() == ["pvlib__pvlib-python-1072"]
    assert r["prompt_tokens"].tolist() == [14, 5, 2]
    assert r["output_tokens"].tolist() == [7, 6, 3]
    assert r["env_estimated"].tolist() == [True, True, False]
    assert r["env_seconds"].iloc[2] == 0.0
    assert (r["reward"] == 1.0).all() and not r["truncated"].any()


def test_bad_lines_are_skipped_and_named(imported):
    assert imported.imported == 4
    assert [w for w, _ in imported.skipped] == [f"{MESSAGES}:5", f"{MESSAGES}:7"]
    assert imported.skipped[0][1].startswith("no assistant turn (2 messages, roles system, user)")
    assert imported.skipped[1][1].startswith("invalid JSON:")
    assert imported.df["task_id"].nunique() == 3 and len(imported.df) == 11


def test_estimates_are_reproducible(imported):
    again = import_traces("messages", [MESSAGES], tokenizer=WORDS)
    np.testing.assert_array_equal(again.df["env_seconds"], imported.df["env_seconds"])


def test_json_array_file_is_accepted(tmp_path):
    recs = [json.loads(line) for line in MESSAGES.read_text().splitlines()[:4]]
    path = tmp_path / "all.json"
    path.write_text(json.dumps(recs, indent=1))
    trajs, skipped = read_file(path, WORDS)
    assert len(trajs) == 4 and skipped == []


def test_traj_file_given_as_messages_is_one_line_error():
    with pytest.raises(TraceError, match=r"a SWE-agent \.traj \(use --format swe-agent\)"):
        read_file(SWE / "astropy__astropy-12907.traj", WORDS)


def test_file_with_only_bad_lines_is_skipped_whole(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{oops\n')
    with pytest.raises(TraceError, match=r"no usable transcript \(line 1: no assistant "
                                         r"turn.*\(and 1 more bad lines\)"):
        read_file(path, WORDS)


@pytest.mark.parametrize(("rec", "message"), [
    ({"instance_id": "x"}, "no message list"),
    ({"messages": ["hello"]}, "holds non-objects"),
    ([1], "a JSON list"),
])
def test_bad_records(rec, message):
    with pytest.raises(TraceError, match=message):
        read_record(rec, "f.jsonl:3", "f:3", WORDS)


def test_truncated_field_and_rewards(tmp_path):
    msgs = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "ok"}]
    recs = [{"id": "a", "messages": msgs, "truncated": True, "reward": 0.25},
            {"id": "b", "messages": msgs, "resolved": -1},
            {"id": "c", "messages": msgs, "score": 2}]
    got = [read_record(r, "x", "x", WORDS) for r in recs]
    assert [t.truncated for t in got] == [True, False, False]
    assert got[0].reward == 0.25 and np.isnan(got[1].reward) and got[2].reward == 2.0


def test_epoch_millisecond_timestamps_and_sharegpt_function_call():
    rec = {"conversations": [
        {"from": "human", "value": "run the tests"},
        {"from": "function_call", "value": json.dumps({"name": "bash", "arguments": {
            "command": "pytest -q"}}), "timestamp": 1_736_937_000_000},
        {"from": "observation", "value": "3 passed", "timestamp": 1_736_937_004_250},
        {"from": "function_call", "value": json.dumps({"name": "bash", "arguments": {
            "command": "pytest -q"}})},
        {"from": "observation", "value": "3 passed"},
    ]}
    t = read_record(rec, "x", "x", WORDS)
    assert t.env_seconds[0] == pytest.approx(4.25)
    assert np.isnan(t.env_seconds[1]) and t.actions[1] == "pytest -q"


def test_durations_that_overflow_when_summed_are_estimated_not_fatal(tmp_path):
    """Two finite durations of 1e308 sum to inf: that line's env time used to reach the final
    validation as inf and fail the whole import (every other file and line with it)."""
    damaged = {"id": "d", "messages": [
        {"role": "user", "content": "fix it"}, {"role": "assistant", "content": "run ls"},
        {"role": "tool", "content": "a b", "duration": 1e308},
        {"role": "tool", "content": "c d", "duration": 1e308},
        {"role": "assistant", "content": "done"}]}
    good = {"id": "g", "messages": [{"role": "user", "content": "go"},
                                    {"role": "assistant", "content": "ok"}]}
    path = tmp_path / "two.jsonl"
    path.write_text(json.dumps(damaged) + "\n" + json.dumps(good) + "\n")
    res = import_traces("messages", [path], tokenizer=WORDS)
    d = rows(res.df, "d")
    assert len(d) == 2 and np.isfinite(d["env_seconds"]).all()
    assert d["env_estimated"].tolist() == [True, False] and len(rows(res.df, "g")) == 1
