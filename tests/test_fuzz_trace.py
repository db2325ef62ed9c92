"""Fuzz: malformed traces end in one ``TraceError`` line, never another exception.

Properties (see ``fuzz_kit`` for the verdict rules) drive ``validate_trace`` with frames
that break one schema rule, ``validate_trace`` with valid-but-odd frames and a write/read
round trip, and ``load_trace`` with files damaged every way a file can be. The plain tests
at the end pin the bugs the fuzzer found in ``traces/`` (fixed there) to exact inputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fuzz_kit import FuzzProperty, expect, materialize, run_property
from fuzz_strategies import MANY_DIGITS, deep
from fuzz_trace_cases import FrameCase, broken_frames, odd_valid_traces, trace_files
from hypothesis import strategies as st

from rlsched.cluster.errors import TraceError
from rlsched.traces import load_trace, validate_trace, write_trace

SOURCE = "fuzz.parquet"


def check_broken_frame(case: FrameCase, folder: Path) -> str:
    return expect(lambda: validate_trace(case.df, SOURCE), TraceError, case.must_fail,
                  names=SOURCE)


def check_valid_round_trip(case: tuple[pd.DataFrame, str], folder: Path) -> str:
    """A valid trace validates, and what ``write_trace`` writes ``load_trace`` reads back."""
    df, suffix = case
    canonical = validate_trace(df, SOURCE)
    assert len(canonical) == len(df)
    path = write_trace(df, folder / f"t{suffix}")
    loaded = load_trace(path)
    assert sorted(loaded["trajectory_id"].unique()) == sorted(canonical["trajectory_id"].unique())
    assert len(loaded) == len(canonical)
    return "ok"


def check_trace_file(case, folder: Path) -> str:
    path = materialize(case, folder)
    return expect(lambda: load_trace(path), TraceError, case.must_fail, names=str(path))


PROPERTIES = (
    FuzzProperty("validate_trace: one schema rule broken", broken_frames, check_broken_frame, 80),
    FuzzProperty("validate_trace + write/load: valid odd traces",
                 lambda: st.tuples(odd_valid_traces(), st.sampled_from([".parquet", ".jsonl"])),
                 check_valid_round_trip, 30),
    FuzzProperty("load_trace: damaged and odd files", trace_files, check_trace_file, 80),
)


@pytest.mark.parametrize("prop", PROPERTIES, ids=lambda p: p.name)
def test_property(prop: FuzzProperty) -> None:
    run_property(prop)


# ---------------------------------------------------------------- pinned regressions
# Each input below crashed traces/ with something other than TraceError (or rejected a
# valid file) before the fix that came with this suite.

BASE = {"task_id": ["a", "a"], "trajectory_id": ["x", "y"], "turn": [0, 0],
        "prompt_tokens": [1, 2], "output_tokens": [3, 4], "env_seconds": [0.0, 1.0]}


def _error(df: pd.DataFrame) -> str:
    with pytest.raises(TraceError) as info:
        validate_trace(df, SOURCE)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_categorical_ids_are_valid(tmp_path):
    df = pd.DataFrame(BASE).astype({"task_id": "category", "trajectory_id": "category"})
    assert validate_trace(df, SOURCE)["task_id"].tolist() == ["a", "a"]
    df.to_parquet(tmp_path / "c.parquet")
    assert load_trace(tmp_path / "c.parquet")["trajectory_id"].tolist() == ["x", "y"]


def test_categorical_integers_are_valid():
    df = pd.DataFrame(BASE).astype({"turn": "category", "prompt_tokens": "category"})
    assert validate_trace(df, SOURCE)["prompt_tokens"].tolist() == [1, 2]


def test_nullable_boolean_truncated_counts_missing_as_false(tmp_path):
    df = pd.DataFrame(BASE).assign(truncated=pd.array([True, None], dtype="boolean"))
    assert validate_trace(df, SOURCE)["truncated"].tolist() == [True, False]
    df.to_parquet(tmp_path / "b.parquet")
    assert load_trace(tmp_path / "b.parquet")["truncated"].tolist() == [True, False]


def test_array_in_truncated_is_a_trace_error(tmp_path):
    pq.write_table(pa.Table.from_pydict({**BASE, "truncated": [[0, 1], [1]]}), tmp_path / "l.parquet")
    with pytest.raises(TraceError, match=r"column truncated: .* expected true or false"):
        load_trace(tmp_path / "l.parquet")


def test_duplicate_column_names_are_a_trace_error(tmp_path):
    names = [*BASE, "turn"]
    table = pa.Table.from_arrays([pa.array(v) for v in [*BASE.values(), [0, 0]]], names=names)
    pq.write_table(table, tmp_path / "d.parquet")
    with pytest.raises(TraceError, match="column 'turn' appears 2 times"):
        load_trace(tmp_path / "d.parquet")


@pytest.mark.parametrize("text", [
    '{"task_id": ' + deep() + "}\n",
    deep(),
])
def test_deeply_nested_json_is_a_trace_error(tmp_path, text):
    path = tmp_path / "deep.jsonl"
    path.write_text(text)
    with pytest.raises(TraceError, match="nested too deeply"):
        load_trace(path)


def _line(**over) -> str:
    rec = {"task_id": "a", "trajectory_id": "x", "turn": 0, "prompt_tokens": 1,
           "output_tokens": 1, "env_seconds": 0, **over}
    return json.dumps(rec)


def test_numbers_beyond_int_parsing_limit_are_a_trace_error(tmp_path):
    path = tmp_path / "digits.jsonl"
    path.write_text(_line(prompt_tokens=1234567).replace("1234567", MANY_DIGITS) + "\n")
    with pytest.raises(TraceError, match="line 1: a number too long to read"):
        load_trace(path)


def test_huge_whole_number_of_seconds_is_a_trace_error(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text(_line(env_seconds=1234567).replace("1234567", "9" * 400) + "\n")
    with pytest.raises(TraceError, match=r"line 1, column env_seconds: .* expected a finite"):
        load_trace(path)


def test_too_long_file_name_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="cannot read the file"):
        load_trace(tmp_path / ("a" * 300 + ".jsonl"))


@pytest.mark.parametrize("odd", ["\u2028", "\u2029", "\x85"])
def test_line_separators_inside_json_strings_are_valid(tmp_path, odd):
    """JSON Lines splits on \\n only; U+2028 and friends may sit raw inside a string."""
    path = tmp_path / "ls.jsonl"
    rows = [json.loads(_line(task_id=f"a{odd}b")), json.loads(_line(task_id="c", trajectory_id="y"))]
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n",
                    encoding="utf-8")
    assert load_trace(path)["task_id"].tolist() == [f"a{odd}b", "c"]


@pytest.mark.parametrize("dtype", ["int64", "uint64"])
def test_int_columns_above_2_62_are_rejected_like_floats(dtype):
    df = pd.DataFrame(BASE)
    df["prompt_tokens"] = np.array([1, 2**62 + 1], dtype=dtype)
    assert "row 2, column prompt_tokens: 4611686018427387905 — expected a whole number below 2**62" \
        in _error(df)
    df["prompt_tokens"] = np.array([1, 2**63 + 1], dtype="uint64")
    assert "9223372036854775809 — expected a whole number below 2**62" in _error(df)


def test_branch_turn_without_parent_column_is_rejected():
    df = pd.DataFrame(BASE).assign(branch_turn=[None, 0])
    assert "row 2, column branch_turn: 0 — expected no branch_turn" in _error(df)


def test_missing_nullable_value_shows_as_missing():
    df = pd.DataFrame(BASE)
    df["env_seconds"] = pd.array([1.0, None], dtype="Float64")
    assert "row 2, column env_seconds: missing value — expected" in _error(df)


def test_cycle_of_ids_with_line_breaks_is_one_line():
    df = pd.DataFrame(BASE).assign(trajectory_id=["a\x1eb", "c\u2028d"],
                                   parent_trajectory_id=["c\u2028d", "a\x1eb"], branch_turn=[0, 0])
    message = _error(df)
    assert len(message.splitlines()) == 1
    assert "branching cycle: 'a\\x1eb' -> 'c\\u2028d' -> 'a\\x1eb'" in message


def _damaged_parquet(tmp_path: Path, old: bytes, new: bytes) -> Path:
    """A Parquet trace with ``old`` replaced by ``new`` (same length) in its raw bytes."""
    df = pd.DataFrame(BASE).assign(task_id=["zqzq", "a"])
    path = tmp_path / "damaged.parquet"
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path, compression="none")
    data = path.read_bytes()
    assert old in data
    path.write_bytes(data.replace(old, new))
    return path


def test_invalid_utf8_in_a_parquet_string_column_is_a_trace_error(tmp_path):
    path = _damaged_parquet(tmp_path, b"zqzq", b"\xff\xfe\xfd\xfc")
    with pytest.raises(TraceError, match=r"not a readable Parquet file .*Invalid UTF8"):
        load_trace(path)


def test_damaged_pandas_metadata_still_loads_the_columns(tmp_path):
    path = _damaged_parquet(tmp_path, b'"columns"', b'"colXmns"')
    assert load_trace(path)["task_id"].tolist() == ["zqzq", "a"]
