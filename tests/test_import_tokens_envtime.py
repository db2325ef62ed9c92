"""Token counting (the chars/4 estimate, a real Hugging Face tokenizer built locally, the
missing-library message) and the env-time estimate model."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from importkit import MESSAGES

from rlsched.cluster.errors import TraceError
from rlsched.traces.envtime import CAP_SECONDS, CLASSES, classify_action, estimate_env_seconds
from rlsched.traces.importers import import_traces
from rlsched.traces.tokens import CharEstimate, HFTokenizer, load_counter, text_of


@pytest.mark.parametrize(("text", "tokens"), [
    ("", 0), ("a", 1), ("abcd", 1), ("abcde", 2), ("x" * 400, 100), ("x" * 401, 101),
])
def test_chars_over_four_estimate(text, tokens):
    assert CharEstimate().count(text) == tokens
    assert CharEstimate().source == "estimate:chars/4"


def test_default_import_uses_the_estimate():
    res = import_traces("messages", [MESSAGES])
    assert res.token_source == "estimate:chars/4"
    # Record 3's final answer "The file has 120 lines." is 23 characters -> 6 tokens.
    last = res.df[res.df["trajectory_id"] == "sharegpt-7"].iloc[-1]
    assert last["output_tokens"] == 6


def test_text_of_shapes():
    assert text_of(None) == ""
    assert text_of("x") == "x"
    assert text_of([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}},
                    {"type": "text", "text": "b"}]) == "a\nb"
    assert text_of({"type": "thinking", "thinking": "hm"}) == "hm"
    assert text_of(3) == "3"


def _train_tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.WordLevelTrainer(special_tokens=["[UNK]"])
    tok.train_from_iterator(["the file has lines", "count the lines in data.csv"], trainer)
    folder = tmp_path / "tiny-tok"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    return folder


def test_real_tokenizer_counts_and_names_itself(tmp_path):
    folder = _train_tokenizer(tmp_path)
    counter = HFTokenizer(folder)
    assert counter.source == "tokenizer:tiny-tok"
    # Whitespace pre-tokenizer splits punctuation: "120", "lines", "." are separate.
    assert counter.count("The file has 120 lines.") == 6
    res = import_traces("messages", [MESSAGES], tokenizer=folder)
    assert set(res.df["token_source"]) == {"tokenizer:tiny-tok"}


def test_missing_tokenizers_library_is_one_line(tmp_path, monkeypatch):
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes `import tokenizers` fail
    with pytest.raises(TraceError, match=r"pip install tokenizers$"):
        load_counter(folder)


def test_bad_tokenizer_paths(tmp_path):
    with pytest.raises(TraceError, match="no such tokenizer directory"):
        HFTokenizer(tmp_path / "missing")
    with pytest.raises(TraceError, match=r"no tokenizer\.json in it"):
        HFTokenizer(tmp_path)


@pytest.mark.parametrize(("action", "cls"), [
    ("", "none"), (None, "none"), ("submit", "submit"), ("exit_cost", "submit"),
    ("python -m pytest tests/ -q", "test"), ("cd /repo && pytest -x", "test"),
    ("go test ./...", "test"), ("pip install -e .", "build"), ("make -j8", "build"),
    ("python reproduce.py", "run"), ("edit 10:12\nx = 1\nend_of_edit", "edit"),
    ("str_replace_editor str_replace", "edit"), ("sed -i s/a/b/ f.py", "edit"),
    ("grep -rn foo src", "search"), ("find_file fields.py", "search"),
    ("search_dir TimeDelta", "search"), ("open src/fields.py 1474", "view"),
    ("str_replace_editor view /repo/a.py", "view"), ("cat setup.cfg", "view"),
    ("git diff", "view"), ("echo hi", "other"),
])
def test_action_classes(action, cls):
    assert classify_action(action) == cls


def test_estimates_are_deterministic_lognormal_around_class_medians():
    keys = [f"t:{i}" for i in range(4000)]
    a = estimate_env_seconds(["pytest"] * 4000, keys)
    b = estimate_env_seconds(["pytest"] * 4000, keys)
    np.testing.assert_array_equal(a, b)
    median = CLASSES["test"].median_seconds
    assert abs(np.median(a) / median - 1) < 0.1
    assert abs(np.log(a).std() - CLASSES["test"].sigma) < 0.05
    assert (estimate_env_seconds(["", "submit"], ["k:0", "k:1"]) >= 0).all()
    assert estimate_env_seconds([""], ["k:0"])[0] == 0.0
    assert estimate_env_seconds(["make"] * 4000, keys).max() <= CAP_SECONDS
