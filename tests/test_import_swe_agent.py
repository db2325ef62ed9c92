"""SWE-agent ``.traj`` import: exact row mapping on hand-counted fixtures (0.x, 1.0, 1.1
shapes), truncation, env-time marking, and one-line errors for bad files."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from importkit import BROKEN, MESSAGES, SWE, FakeWordCounter

from rlsched.cluster.errors import TraceError
from rlsched.traces.import_common import exit_truncates
from rlsched.traces.import_swe_agent import read_swe_agent
from rlsched.traces.importers import import_traces

WORDS = FakeWordCounter()


def test_v0_shape_rows_match_hand_count():
    # Turn 0: system (9 words) + demo (8) + instance prompt (9). Turns 1, 2: the previous
    # step's observation (10, 6). Outputs: the responses (11, 14, 9; each contains its
    # action). The final "Exit due to cost limit" step is SWE-agent's, not the model's.
    t = read_swe_agent(SWE / "marshmallow-code__marshmallow-1867.traj", WORDS)
    assert t.task_id == t.trajectory_id == "marshmallow-code__marshmallow-1867"
    assert t.prompt_tokens == (26, 10, 6)
    assert t.output_tokens == (11, 14, 9)
    assert all(math.isnan(s) for s in t.env_seconds)  # 0.x has no execution_time
    assert t.truncated and t.exit_status == "submitted (exit_cost)"


def test_v1_1_shape_rows_match_hand_count():
    # Turn 0: system (6) + instance prompt given as two content parts (6 + 5). Function
    # calling keeps the action out of the response, so it is added: 5+2, 3+10, 4+2, 3+1.
    t = read_swe_agent(SWE / "SWE-agent__test-repo-i1.traj", WORDS)
    assert t.task_id == "SWE-agent__test-repo-i1"
    assert t.prompt_tokens == (17, 12, 2, 1)
    assert t.output_tokens == (7, 13, 6, 4)
    assert t.env_seconds == (0.2814128329991945, 0.05, 1.25, 0.5)  # first one was a string
    assert not t.truncated


def test_v1_0_exit_context_drops_scaffold_step_and_keeps_format_error_turn():
    t = read_swe_agent(SWE / "astropy__astropy-12907.traj", WORDS)
    assert t.task_id == "astropy__astropy-12907"  # from replay_config (an object here)
    assert t.prompt_tokens == (10, 3, 0)  # the format-error step observed nothing
    assert t.output_tokens == (6, 7, 4)
    assert t.env_seconds == (0.4, 0.0, 12.5)
    assert t.truncated and t.exit_status == "exit_context"


def test_task_id_comes_from_replay_config_not_file_name(tmp_path):
    copy = tmp_path / "run-7.traj"
    shutil.copy(SWE / "SWE-agent__test-repo-i1.traj", copy)
    t = read_swe_agent(copy, WORDS)
    assert (t.task_id, t.trajectory_id) == ("SWE-agent__test-repo-i1", "run-7")


def test_query_is_used_when_history_is_missing(tmp_path):
    doc = json.loads((SWE / "SWE-agent__test-repo-i1.traj").read_text())
    del doc["history"]
    path = tmp_path / "x.traj"
    path.write_text(json.dumps(doc))
    assert read_swe_agent(path, WORDS).prompt_tokens[0] == 17


def test_missing_exit_status_means_cut_off(tmp_path):
    doc = json.loads((SWE / "SWE-agent__test-repo-i1.traj").read_text())
    del doc["info"]["exit_status"]
    path = tmp_path / "x.traj"
    path.write_text(json.dumps(doc))
    assert read_swe_agent(path, WORDS).truncated


@pytest.mark.parametrize(("status", "truncated"), [
    ("submitted", False), ("exit_command", False), ("exit_forfeit", False),
    ("exit_cost", True), ("exit_context", True), ("exit_format", True), ("exit_error", True),
    ("exit_api", True), ("exit_total_execution_time", True), ("exit_command_timeout", True),
    ("early_exit", True), ("submitted (exit_cost)", True), ("submitted (exit_context)", True),
    ("Submitted (exit_format)", True), ("exit_something_new", True),
])
def test_exit_status_classification(status, truncated):
    assert exit_truncates(status, missing=False) is truncated


def test_import_marks_estimated_env_rows_and_truncation():
    res = import_traces("swe-agent", [SWE], tokenizer=WORDS)
    df = res.df
    assert res.imported == 3 and res.skipped == [] and len(df) == 10
    est = df.groupby("trajectory_id")["env_estimated"].all()
    assert est.to_dict() == {"SWE-agent__test-repo-i1": False, "astropy__astropy-12907": False,
                             "marshmallow-code__marshmallow-1867": True}
    assert res.env_estimated == 3
    old = df[df["trajectory_id"] == "marshmallow-code__marshmallow-1867"]
    assert (old["env_seconds"] > 0).all()  # filled, not left at zero
    trunc = df.groupby("trajectory_id")["truncated"].all()
    assert trunc.to_dict() == {"SWE-agent__test-repo-i1": False, "astropy__astropy-12907": True,
                               "marshmallow-code__marshmallow-1867": True}
    assert set(df["token_source"]) == {"fake:words"}


def test_bad_files_are_skipped_with_one_line_and_the_rest_imports():
    res = import_traces("swe-agent", [SWE, BROKEN, MESSAGES, SWE / "nope.traj"],
                        tokenizer=WORDS)
    assert res.imported == 3
    reasons = dict(res.skipped)
    assert set(reasons) == {str(BROKEN / "astropy__astropy-14182.traj"), str(MESSAGES),
                            str(SWE / "nope.traj")}
    assert "invalid JSON (truncated file?)" in reasons[str(BROKEN / "astropy__astropy-14182.traj")]
    assert "--format messages" in reasons[str(MESSAGES)]
    assert reasons[str(SWE / "nope.traj")] == "no such file"
    assert all("\n" not in r for r in reasons.values())


def test_all_inputs_bad_is_an_error():
    with pytest.raises(TraceError, match=r"nothing imported.*astropy__astropy-14182\.traj"):
        import_traces("swe-agent", [BROKEN, MESSAGES])


@pytest.mark.parametrize(("doc", "message"), [
    ({"history": [], "info": {}}, "no 'trajectory' list"),
    ({"messages": [{"role": "user", "content": "x"}]}, "use --format messages"),
    ([1, 2], "a JSON list"),
    ({"trajectory": [{"response": "Exit due to cost limit", "action": "exit_cost"}],
      "history": []}, "no model turns"),
    ({"trajectory": [{"response": "ls", "action": "ls", "execution_time": "slow"}],
      "history": [{"role": "user", "content": "go"}]}, "execution_time 'slow'"),
    ({"trajectory": [{"response": "ls", "action": "ls"}]}, "no 'history' and no 'query'"),
])
def test_malformed_traj_errors_name_the_file(tmp_path, doc, message):
    path = tmp_path / "bad.traj"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=message) as err:
        read_swe_agent(path, WORDS)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)


def test_duplicate_file_names_get_unique_trajectory_ids(tmp_path):
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        shutil.copy(SWE / "astropy__astropy-12907.traj", tmp_path / run)
    df = import_traces("swe-agent", [tmp_path], tokenizer=WORDS).df
    assert list(df["trajectory_id"].unique()) == ["astropy__astropy-12907",
                                                  "astropy__astropy-12907#2"]
    assert df["task_id"].nunique() == 1  # two samples of one task: a group
