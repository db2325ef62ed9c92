"""mini-swe-agent import: the 2.x layout (tool calls, per-message timestamps and usage, a
billed reply that failed to parse as its own turn), 1.17 (top-level timestamps), 1.0-1.16
(role/content only), and one-line skips for predictions files, cut-off and unknown files."""

from __future__ import annotations

import json
import math
import re

import pytest
from importkit import FIXTURES, FakeWordCounter

from rlsched.cluster.errors import TraceError
from rlsched.traces.import_common import RECORDED_SOURCE
from rlsched.traces.import_mini_swe_agent import read_file, read_trajectory
from rlsched.traces.importers import import_traces

WORDS = FakeWordCounter()
MINI = FIXTURES / "mini_swe_agent"
V2 = MINI / "django__django-15814" / "django__django-15814.traj.json"
V117 = MINI / "pytest-dev__pytest-7122.traj.json"
V1 = MINI / "last_mini_run.traj.json"


def test_v2_layout_with_a_format_error_turn():
    (t,), _ = read_file(V2, WORDS)
    assert t.task_id == t.trajectory_id == "django__django-15814"
    # five billed calls, the third failed to parse (no tool call): still a turn, ran nothing,
    # and its reply is not in the next context (2270 - 2210, no 24 subtracted)
    assert t.output_tokens == (61, 97, 24, 45, 52)
    assert t.prompt_tokens == (1402, 1560 - 1402 - 61, 2210 - 1560 - 97, 2270 - 2210,
                               2390 - 2270 - 45)
    assert t.token_sources == (RECORDED_SOURCE,) * 5
    assert t.env_seconds[:4] == (0.284, 0.087, 0.0, 9.735)
    assert math.isnan(t.env_seconds[4])  # the submit's exit message has no timestamp
    assert t.actions[2] == "" and t.actions[4] == "submit"
    assert not t.truncated and t.exit_status == "Submitted"


def test_v1_17_timestamps_and_limits_exceeded():
    (t,), _ = read_file(V117, WORDS)
    assert t.prompt_tokens == (610, 690 - 610 - 33, 780 - 690 - 58)
    assert t.output_tokens == (33, 58, 30)
    # the unparsable reply (two code blocks) stays a turn; 1 ms until the error message
    assert t.env_seconds == (0.261, 0.001, 6.58)
    assert t.truncated and t.exit_status == "LimitsExceeded"


def test_v1_without_timing_or_usage_is_counted_and_estimated():
    (t,), _ = read_file(V1, WORDS)
    assert t.task_id == t.trajectory_id == "last_mini_run"  # no instance_id: the file name
    assert t.prompt_tokens[0] == 9 + 22  # system + task words
    assert t.output_tokens == (7, 10, 7)
    assert all(math.isnan(s) for s in t.env_seconds)
    assert t.actions == ("cat pyproject.toml | head -20",
                         "sed -i 's/^VERSION = .*/VERSION = \"0.4.1\"/' sample/__main__.py",
                         "submit")
    assert t.token_sources == ("fake:words",) * 3


def test_directory_import_skips_preds_json_with_a_reason():
    res = import_traces("mini-swe-agent", [MINI], tokenizer=WORDS)
    assert res.imported == 3 and res.files == 4
    (where, reason), = res.skipped
    assert where == str(MINI / "preds.json")
    assert reason.startswith("a predictions file (instance id -> model_patch), no messages")
    df = res.df
    assert df.loc[df["trajectory_id"] == "last_mini_run", "env_estimated"].all()
    assert res.token_recorded == 8


def test_broken_and_unknown_files_are_skipped_with_one_line_each():
    broken = FIXTURES / "broken" / "mini_swe_agent" / "pytest-dev__pytest-5103.traj.json"
    unknown = FIXTURES / "unknown" / "run_config.json"
    res = import_traces("mini-swe-agent", [broken, unknown, V2])
    reasons = dict(res.skipped)
    assert res.imported == 1
    assert reasons[str(broken)].startswith("invalid JSON (truncated file?)")
    assert reasons[str(unknown)] == ("an object with keys agent, environment, model — expected "
                                     "a mini-swe-agent trajectory (.traj.json with messages "
                                     "and info)")


@pytest.mark.parametrize(("doc", "message"), [
    ({"messages": [{"role": "system", "content": "x"}]}, "no model call in its 1 messages"),
    ({"messages": ["hi"]}, "messages[0] is a JSON str"),
    ({"trajectory": [], "history": [], "info": {}}, "looks like --format swe-agent"),
    ([1, 2], "a JSON list"),
])
def test_document_errors_are_one_line(tmp_path, doc, message):
    with pytest.raises(TraceError, match=re.escape(message)):
        read_trajectory(tmp_path / "x.traj.json", doc, WORDS)


def test_missing_exit_status_means_cut_off(tmp_path):
    doc = json.loads(V2.read_text())
    doc["info"].pop("exit_status")
    doc["messages"].pop()  # the exit message too: the run stopped mid-way
    t = read_trajectory(tmp_path / "x.traj.json", doc, WORDS)
    assert t.truncated and t.exit_status is None


def test_v2_responses_api_messages(tmp_path):
    """Responses-API models store the response itself as the message (no role; ``output``
    items and ``usage.input_tokens``/``output_tokens``) and observations as
    ``function_call_output``."""
    call = {"type": "function_call", "call_id": "fc_1", "name": "bash",
            "arguments": json.dumps({"command": "ls -la"})}
    doc = {"trajectory_format": "mini-swe-agent-1.1", "info": {"exit_status": "Submitted"},
           "messages": [
               {"role": "system", "content": "You solve tasks."},
               {"role": "user", "content": "List the files."},
               {"id": "resp_1", "object": "response", "output": [
                   {"type": "message", "content": [{"type": "output_text", "text": "Listing."}]},
                   call], "usage": {"input_tokens": 120, "output_tokens": 14},
                "extra": {"actions": [{"command": "ls -la", "tool_call_id": "fc_1"}],
                          "cost": 0.001, "timestamp": 100.0}},
               {"type": "function_call_output", "call_id": "fc_1",
                "output": "<returncode>0</returncode>\n<output>\na b c\n</output>",
                "extra": {"returncode": 0, "timestamp": 100.75}},
               {"id": "resp_2", "object": "response", "output": [
                   {"type": "message", "content": [{"type": "output_text", "text": "Done."}]}],
                "usage": {"input_tokens": 150, "output_tokens": 3},
                "extra": {"actions": [], "timestamp": 103.0}},
               {"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}},
           ]}
    t = read_trajectory(tmp_path / "r.traj.json", doc, WORDS)
    assert t.prompt_tokens == (120, 150 - 120 - 14) and t.output_tokens == (14, 3)
    assert t.env_seconds == (0.75, 0.0)  # the second reply ran no command
    assert t.actions == ("ls -la", "")
    assert t.token_sources == (RECORDED_SOURCE,) * 2
