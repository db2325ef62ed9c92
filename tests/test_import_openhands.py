"""OpenHands evaluation output import: rows match the hand-checked fixtures (V0 events with
per-call usage, parallel tool calls with usage only in ``metrics``, the 2024 pair layout,
V1 SDK events), truncation and reward, and one-line skips for bad lines and files."""

from __future__ import annotations

import json
import math
import re

import pytest
from importkit import FIXTURES, FakeWordCounter

from rlsched.cluster.errors import TraceError
from rlsched.traces.import_common import RECORDED_SOURCE, usage_prompt_deltas
from rlsched.traces.import_openhands import read_file, read_record
from rlsched.traces.importers import import_traces

WORDS = FakeWordCounter()
OPENHANDS = FIXTURES / "openhands"


@pytest.fixture(scope="module")
def v0():
    trajs, skipped = read_file(OPENHANDS / "output.jsonl", WORDS)
    assert skipped == []
    return {t.task_id: t for t in trajs}


def test_function_calling_run_uses_recorded_usage_and_timestamps(v0):
    t = v0["psf__requests-2317"]
    # prompt_tokens per call: 1850, 1960, 2240, 2420; completions 42, 131, 55, 38.
    assert t.prompt_tokens == (1850, 1960 - 1850 - 42, 2240 - 1960 - 131, 2420 - 2240 - 55)
    assert t.output_tokens == (42, 131, 55, 38)
    assert t.token_sources == (RECORDED_SOURCE,) * 4
    # action -> the observation whose cause is its id; finish ran nothing
    assert t.env_seconds == (0.532126, 0.182383, 18.453357, 0.0)
    assert t.actions[2].endswith("pytest test_requests.py -q -k method")
    assert (t.reward, t.truncated, t.exit_status) == (1.0, False, "finish")


def test_parallel_calls_are_one_turn_and_usage_comes_from_metrics(v0):
    t = v0["sympy__sympy-20590"]
    # Two actions of response c77e01 are one turn: 3.0 s from the first action to the last
    # observation. Turn 2 is a message (no response id, no usage): its words are counted
    # (17 out, 4 in: the grep output), and turn 3's prompt falls back to words (21: the fake
    # user reply) because the turn before it has no usage to subtract.
    assert t.prompt_tokens == (1500, 1900 - 1500 - 60, 4, 21)
    assert t.output_tokens == (60, 35, 17, 20)
    assert t.token_sources == (RECORDED_SOURCE, RECORDED_SOURCE, "fake:words", "fake:words")
    assert t.env_seconds[:3] == (3.0, 0.9, 0.0) and math.isnan(t.env_seconds[3])
    assert t.truncated and t.exit_status.startswith("RuntimeError: Agent reached maximum")
    assert math.isnan(t.reward)  # not evaluated yet


def test_old_pair_layout(v0):
    t = v0["csvkit-417"]
    # instruction 16 words; "Let me look around the repository first." + "ls"; ls output 3
    assert t.prompt_tokens[:2] == (16, 3)
    assert t.output_tokens[0] == 8
    assert t.env_seconds == (0.312, 12.25, 0.0)  # the null observation is no observation
    assert not t.truncated and t.exit_status == "finish"


def test_v1_sdk_events():
    (t,), _ = read_file(OPENHANDS / "output_v1.jsonl", WORDS)
    assert t.task_id == t.trajectory_id == "astropy__astropy-14995"
    assert t.prompt_tokens == (6120, 6290 - 6120 - 88, 6460 - 6290 - 140)
    assert t.output_tokens == (88, 140, 31)
    assert t.env_seconds == (27.5, 0.21, 0.0)
    assert t.actions[1] == "str_replace_editor str_replace"
    assert (t.reward, t.truncated) == (0.0, False)


def test_import_marks_estimated_rows():
    res = import_traces("openhands", [OPENHANDS], tokenizer=WORDS)
    df = res.df
    assert res.imported == 4 and res.files == 2 and res.skipped == []
    sympy = df[df["task_id"] == "sympy__sympy-20590"]
    assert sympy["env_estimated"].tolist() == [False, False, False, True]
    assert sympy["env_seconds"].iloc[3] > 0  # a pytest run, estimated
    assert res.token_recorded == int((df["token_source"] == RECORDED_SOURCE).sum()) == 9


def test_bad_line_is_skipped_and_the_rest_imported(tmp_path):
    lines = (OPENHANDS / "output.jsonl").read_text().splitlines()
    path = tmp_path / "output.jsonl"
    path.write_text("\n".join([lines[0], '{"instance_id": "x", "history": {}}', lines[1][:300],
                               '{"loss": 0.3}']) + "\n")
    trajs, skipped = read_file(path, WORDS)
    assert [t.task_id for t in trajs] == ["psf__requests-2317"]
    reasons = dict(skipped)
    assert reasons[f"{path}:2"].startswith("'history' is an object with keys none")
    assert reasons[f"{path}:3"].startswith("invalid JSON: ")
    assert reasons[f"{path}:4"].startswith("an object with keys loss — expected an OpenHands")
    assert all("\n" not in r for r in reasons.values())


@pytest.mark.parametrize(("rec", "message"), [
    ({"instance_id": "a", "history": []}, "no LLM call in its history (0 events"),
    ({"instance_id": None, "history": []}, "instance_id is None"),
    ({"instance_id": "a", "history": [3]}, "history[0] is a JSON int"),
    ({"instance_id": "a", "history": None, "error": "Maximum retries (5) reached: boom\nx"},
     "no history (error: Maximum retries (5) reached: boom) — expected the events"),
    ({"input": "q", "output": "a", "score": 1.0}, "looks like --format verl"),
])
def test_record_errors_are_one_line(rec, message):
    with pytest.raises(TraceError, match=re.escape(message)):
        read_record(rec, "f:1", WORDS)


def test_broken_and_unknown_files_are_skipped_with_one_line_each():
    broken = FIXTURES / "broken" / "openhands" / "output.jsonl"
    unknown = FIXTURES / "unknown" / "metrics.jsonl"
    res = import_traces("openhands", [broken, unknown, OPENHANDS])
    reasons = dict(res.skipped)
    assert res.imported == 4
    assert reasons[str(broken)].startswith("invalid JSON (truncated file?)")
    assert reasons[str(unknown)].startswith("nothing usable (line 1: an object with keys "
                                            "actor/pg_loss")
    with pytest.raises(TraceError, match="nothing imported, every input was skipped"):
        import_traces("openhands", [broken, unknown])


def test_usage_deltas_fall_back_when_context_shrank():
    # a condenser cut the context between calls 1 and 2: the difference says nothing
    assert usage_prompt_deltas([1000, 1200, 600, 700], [50, 40, 30, 20], [True] * 4) == [
        1000, 150, None, 70]
    assert usage_prompt_deltas([None, 500], [10, 5], [True, True]) == [None, None]
    # an unparsable reply that the scaffold dropped is not part of the next context
    assert usage_prompt_deltas([100, 130], [80, 5], [False, True]) == [100, 30]


def test_metrics_usage_is_matched_by_response_id_only(tmp_path):
    rec = json.loads((OPENHANDS / "output.jsonl").read_text().splitlines()[1])
    rec["metrics"]["token_usages"] = [dict(u, response_id="other") for u in
                                      rec["metrics"]["token_usages"]]
    t = read_record(rec, "f:1", WORDS)
    assert RECORDED_SOURCE not in t.token_sources
