"""verl rollout-dump import: turns split at the chat template's tool-response boundaries
(Qwen/Hermes with and without special tokens, the documented ``tool`` role), the RL step
kept, every env time estimated, and one-line skips for bad lines and files."""

from __future__ import annotations

import json
import math
import re

import pytest
from importkit import FIXTURES, FakeWordCounter

from rlsched.cli.trace_import import summary_lines
from rlsched.cluster.errors import TraceError
from rlsched.traces import load_trace
from rlsched.traces.batches import draw_batches
from rlsched.traces.import_verl import read_file, read_record, split_turns
from rlsched.traces.importers import import_traces

WORDS = FakeWordCounter()
ROLLOUT = FIXTURES / "verl" / "rollout"
CALL = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1)"}}\n</tool_call>'


@pytest.mark.parametrize(("output", "tools"), [
    # Qwen2.5/3 decoded with skip_special_tokens=True: role names stay, markers go
    (f"a{CALL}user\n<tool_response>\n1\n</tool_response>\nassistant\nb",
     ["user\n<tool_response>\n1\n</tool_response>\nassistant\n"]),
    # two tool results in one block, special tokens kept
    (f"a{CALL}{CALL}<|im_end|>\n<|im_start|>user\n<tool_response>\n1\n</tool_response>\n"
     f"<tool_response>\n2\n</tool_response><|im_end|>\n<|im_start|>assistant\nb<|im_end|>",
     ["<|im_end|>\n<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n2"
      "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"]),
    # the documented SGLang sample: a bare "tool" role
    (f"assistant\na{CALL}\ntool\n1\n\nassistant\nb", ["\ntool\n1\n\nassistant\n"]),
    # Llama 3 with header tokens kept
    ("a<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n1<|eot_id|>"
     "<|start_header_id|>assistant<|end_header_id|>\n\nb",
     ["<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n1<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n"]),
])
def test_split_at_tool_response_boundaries(output, tools):
    turns = split_turns(output)
    assert [tool for _, tool in turns] == [*tools, ""]
    assert turns[0][0].startswith("a") and turns[-1][0].strip().startswith("b")


def test_role_words_in_the_models_own_text_are_not_boundaries():
    text = "The user\n<tool_response>\nfake\n</tool_response>\nassistant\nsaid so."
    assert split_turns(text) == [(text, "")]
    assert split_turns("plain single-turn answer\n#### 3") == [
        ("plain single-turn answer\n#### 3", "")]


def test_fixture_rows_match_hand_count():
    trajs, skipped = read_file(ROLLOUT / "1.jsonl", WORDS)
    assert skipped == []
    a, b, c, d = trajs
    assert a.trajectory_id == "1:1" and a.step == 1 and a.reward == 1.0
    assert a.task_id == b.task_id != c.task_id == d.task_id  # GRPO samples share the prompt
    assert a.prompt_tokens == (158, 5)  # the prompt; "user <tool_response> 72 </...> assistant"
    assert a.output_tokens == (32, 10)
    assert math.isnan(a.env_seconds[0]) and a.env_seconds[1] == 0.0
    assert a.actions[0].startswith("python april = 48")
    assert len(b.prompt_tokens) == 1 and not b.truncated
    assert len(c.prompt_tokens) == 3 and not c.truncated
    assert d.truncated and d.exit_status == "unanswered tool call" and d.reward == 0.0


def test_import_keeps_the_step_and_flags_every_tool_turn_as_estimated(tmp_path):
    res = import_traces("verl", [ROLLOUT], tokenizer=WORDS)
    df = res.df
    assert res.imported == 6 and sorted(df["step"].unique().tolist()) == [1, 2]
    tool_turns = df.groupby("trajectory_id")["turn"].transform("max") > df["turn"]
    assert (df["env_estimated"] == tool_turns).all()
    assert res.token_recorded == 0 and (df["token_source"] == "fake:words").all()
    # a replay draws the recorded batches: step 0 = the four rollouts of RL step 1
    batches = draw_batches(df, 2)
    assert [len(b) for b in batches] == [4, 2]
    assert {d.trace_id for d in batches[1]} == {"2:1", "2:2"}
    path = tmp_path / "verl.jsonl"
    res.df.to_json(path, orient="records", lines=True)
    assert len(load_trace(path)) == len(df)


def test_a_line_without_step_takes_its_files_step(tmp_path):
    # verl names each dump <step>.jsonl; one line without the field (a dump edited or
    # merged by hand) dropped the step column from the whole import
    lines = [json.loads(x) for x in (ROLLOUT / "2.jsonl").read_text().splitlines()]
    del lines[0]["step"]
    (tmp_path / "2.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    res = import_traces("verl", [ROLLOUT / "1.jsonl", tmp_path / "2.jsonl"], tokenizer=WORDS)
    assert res.notes == ()
    steps = res.df.groupby("trajectory_id")["step"].first()
    assert steps.to_dict() == {"1:1": 1, "1:2": 1, "1:3": 1, "1:4": 1, "2:1": 2, "2:2": 2}


def test_a_step_recorded_on_only_some_trajectories_is_said_not_dropped_silently(tmp_path):
    lines = [json.loads(x) for x in (ROLLOUT / "2.jsonl").read_text().splitlines()]
    del lines[1]["step"]
    (tmp_path / "merged.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    res = import_traces("verl", [ROLLOUT / "1.jsonl", tmp_path / "merged.jsonl"], tokenizer=WORDS)
    assert "step" not in res.df.columns
    assert res.notes == ("step: recorded on 5 of 6 trajectories (not on 'merged:2'), so the trace "
                         "has no step column and a replay draws its batches at random; give every "
                         "trajectory its step to replay the recorded batches",)
    assert res.notes[0] in summary_lines(res)


def test_bad_lines_are_skipped_and_the_rest_imported(tmp_path):
    good = (ROLLOUT / "2.jsonl").read_text().splitlines()
    path = tmp_path / "7.jsonl"
    path.write_text("\n".join([
        good[0],
        json.dumps({"input": "q", "output": "a", "score": "high", "step": 7}),
        json.dumps({"input": "q", "output": "a", "score": 1, "step": -1}),
        good[1][:80],
        json.dumps({"input": "q", "output": "a", "score": 1, "step": 10**30}),
    ]) + "\n")
    trajs, skipped = read_file(path, WORDS)
    assert len(trajs) == 1
    reasons = dict(skipped)
    assert reasons[f"{path}:2"] == "score 'high' — expected a finite number"
    assert reasons[f"{path}:3"] == "step -1 — expected a whole number >= 0 (below 2**62)"
    assert reasons[f"{path}:4"].startswith("invalid JSON")
    assert reasons[f"{path}:5"].startswith(f"step {10**30} — expected")


@pytest.mark.parametrize(("rec", "message"), [
    ({"input": "q", "output": [1, 2]}, "'output' is a JSON list — expected decoded text"),
    ({"prompt": "q", "response": "a"}, "an object with keys prompt, response — expected a verl"),
    ({"instance_id": "x", "history": [], "test_result": {}}, "looks like --format openhands"),
])
def test_record_errors_are_one_line(rec, message):
    with pytest.raises(TraceError, match=re.escape(message)):
        read_record(rec, "f:1", "f:1", WORDS)


def test_broken_and_unknown_files_are_skipped_with_one_line_each():
    broken = FIXTURES / "broken" / "verl" / "3.jsonl"
    unknown = FIXTURES / "unknown" / "metrics.jsonl"
    res = import_traces("verl", [broken, unknown, ROLLOUT / "2.jsonl"])
    reasons = dict(res.skipped)
    assert res.imported == 2
    assert reasons[str(broken)] == ("'output' is a JSON list — expected decoded text (token ids "
                                    "cannot be split into turns)")
    assert reasons[str(unknown)].startswith("nothing usable (line 1: an object with keys")


def test_unfinished_or_user_blocks_stay_in_the_turn():
    # cut inside the tool response (no assistant header follows): one turn, unanswered call
    cut = f"a{CALL}user\n<tool_response>\npartial"
    assert split_turns(cut) == [(cut, "")]
    # a simulated user's reply (verl interactions) is not a tool response
    chat = f"a{CALL}user\nplease go on\nassistant\nb"
    assert len(split_turns(chat)) == 1


def test_degenerate_outputs_stay_linear():
    """Outputs of many role headers or unclosed tags (what a collapsing policy writes) used
    to cost quadratic regex backtracking; 238 kB took minutes."""
    import time

    start = time.perf_counter()
    split_turns(("</tool_call>\ntool\n" + "z " * 50 + "\n") * 2000)
    read_record({"input": "q", "output": "<tool_call> x " * 20000, "score": 0.0}, "f:1",
                "f:1", WORDS)
    assert time.perf_counter() - start < 10.0


def test_tokenizer_counts_the_decoded_text(tmp_path):
    """``--tokenizer DIR``: counts come from a real Hugging Face tokenizer (one trained here
    on the fixture text, word level), and every row names it."""
    tokenizers = pytest.importorskip("tokenizers")
    text = (ROLLOUT / "1.jsonl").read_text()
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator([text], tokenizers.trainers.WordLevelTrainer(
        special_tokens=["[UNK]"]))
    folder = tmp_path / "qwen-like"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    res = import_traces("verl", [ROLLOUT / "1.jsonl"], tokenizer=folder)
    assert set(res.df["token_source"]) == {"tokenizer:qwen-like"}
    # whitespace-split words == the fake word counter's counts on the same text
    words = import_traces("verl", [ROLLOUT / "1.jsonl"], tokenizer=WORDS).df
    assert res.df["prompt_tokens"].tolist() == words["prompt_tokens"].tolist()
    assert res.df["output_tokens"].tolist() == words["output_tokens"].tolist()
