"""Loading, validating and writing traces: canonical form and one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from rlsched.cluster.errors import TraceError
from rlsched.traces import (
    OPTIONAL_COLUMNS,
    TRACE_COLUMNS,
    load_trace,
    validate_trace,
    write_trace,
)


def small_trace() -> pd.DataFrame:
    """Two tasks; t2 forks t1 at turn 1 (shares turn 0), rows deliberately out of order."""
    return pd.DataFrame({
        "task_id": ["a", "a", "a", "a", "b", "b"],
        "trajectory_id": ["t1", "t1", "t2", "t2", "t3", "t3"],
        "turn": [1, 0, 0, 1, 0, 1],
        "prompt_tokens": [50, 100, 100, 70, 80, 20],
        "output_tokens": [20, 30, 30, 40, 10, 5],
        "env_seconds": [1.5, 2.0, 2.0, 0.5, 0.0, 3.25],
        "parent_trajectory_id": [None, None, "t1", "t1", None, None],
        "branch_turn": [None, None, 1, 1, None, None],
        "reward": [1.0, 1.0, 0.0, 0.0, np.nan, np.nan],
        "truncated": [False, False, False, False, True, True],
        "extra": ["x", "y", "z", "w", "v", "u"],
    })


def error_of(df: pd.DataFrame, source: str = "f.parquet") -> str:
    with pytest.raises(TraceError) as info:
        validate_trace(df, source)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{source}: ")
    return message


def test_contract_names():
    assert TRACE_COLUMNS == ("task_id", "trajectory_id", "turn", "prompt_tokens",
                             "output_tokens", "env_seconds")
    assert set(OPTIONAL_COLUMNS) == {"parent_trajectory_id", "branch_turn", "reward",
                                     "truncated", "step", "policy_version"}


def test_canonical_form_orders_rows_and_sets_dtypes():
    out = validate_trace(small_trace(), "mem")
    assert out["trajectory_id"].tolist() == ["t1", "t1", "t2", "t2", "t3", "t3"]
    assert out["turn"].tolist() == [0, 1, 0, 1, 0, 1]
    assert out["prompt_tokens"].tolist() == [100, 50, 100, 70, 80, 20]
    assert out["extra"].tolist() == ["y", "x", "z", "w", "v", "u"]  # kept, moved with rows
    assert out["task_id"].dtype == object and isinstance(out["task_id"].iloc[0], str)
    for col in ("turn", "prompt_tokens", "output_tokens"):
        assert out[col].dtype == np.int64
    assert out["env_seconds"].dtype == np.float64
    assert out["reward"].dtype == np.float64
    assert out["truncated"].dtype == bool
    assert str(out["branch_turn"].dtype) == "Int64"
    assert out["parent_trajectory_id"].tolist() == [None, None, "t1", "t1", None, None]
    assert list(out.index) == list(range(6))


def test_optional_columns_absent_stay_absent():
    df = small_trace()[list(TRACE_COLUMNS)]
    out = validate_trace(df, "mem")
    assert list(out.columns) == list(TRACE_COLUMNS)


@pytest.mark.parametrize("suffix", [".parquet", ".pq", ".jsonl", ".json"])
def test_round_trip(tmp_path, suffix):
    path = write_trace(small_trace(), tmp_path / f"t{suffix}")
    back = load_trace(path)
    pd.testing.assert_frame_equal(back, validate_trace(small_trace(), "mem"))


def test_sniffs_unknown_suffix(tmp_path):
    pq_path = write_trace(small_trace(), tmp_path / "t.parquet")
    other = tmp_path / "trace.bin"
    other.write_bytes(pq_path.read_bytes())
    assert len(load_trace(other)) == 6
    jl = tmp_path / "trace.txt"
    jl.write_text("\n".join(json.dumps(r) for r in small_trace().drop(
        columns=["reward"]).to_dict("records")))
    assert len(load_trace(jl)) == 6
    junk = tmp_path / "trace.csv"
    junk.write_text("task_id,trajectory_id\n")
    with pytest.raises(TraceError, match="unknown trace format"):
        load_trace(junk)


def test_step_row_groups_and_single_step_load(tmp_path):
    df = validate_trace(small_trace(), "mem")
    df["step"] = pd.array([1, 1, 1, 1, 0, 0], dtype="Int64")
    path = write_trace(df, tmp_path / "steps.parquet")
    meta = pq.ParquetFile(path).metadata
    assert meta.num_row_groups == 2
    one = load_trace(path, steps=[1])
    assert sorted(one["trajectory_id"].unique()) == ["t1", "t2"]
    # Written step by step: step 0 first.
    assert load_trace(path)["trajectory_id"].iloc[0] == "t3"


def test_file_errors(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "missing.parquet")
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    with pytest.raises(TraceError, match="empty file"):
        load_trace(empty)
    good = write_trace(small_trace(), tmp_path / "good.parquet").read_bytes()
    for name, data in {"garbled": b"not parquet at all" * 10,
                       "truncated": good[: len(good) // 2]}.items():
        bad = tmp_path / f"{name}.parquet"
        bad.write_bytes(data)
        with pytest.raises(TraceError) as info:
            load_trace(bad)
        assert str(bad) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_writing_where_no_file_can_be_is_one_line(tmp_path, suffix):
    """A folder as the path, or a path below a file: pyarrow's and pandas' OSError used to
    reach the user as a traceback (``rlsched trace import -o DIR``)."""
    folder = tmp_path / f"folder{suffix}"
    folder.mkdir()
    plain = tmp_path / "plain"
    plain.write_text("x")
    for target in (folder, plain / f"x{suffix}"):
        with pytest.raises(TraceError) as info:
            write_trace(small_trace(), target)
        message = str(info.value)
        assert message.startswith(f"{target}: cannot write the trace (") and "\n" not in message


def test_jsonl_errors_name_the_line(tmp_path):
    rows = [json.dumps(r) for r in small_trace().drop(columns=["reward"]).to_dict("records")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([rows[0], rows[1], "{not json", *rows[2:]]))
    with pytest.raises(TraceError, match=r"bad\.jsonl: line 3: "):
        load_trace(bad)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(rows[0].encode() + b"\n" + b'{"task_id": "caf\xe9"}\n')
    with pytest.raises(TraceError, match=r"line 2: byte 0xe9 is not UTF-8"):
        load_trace(latin)
    notobj = tmp_path / "list.jsonl"
    notobj.write_text(rows[0] + "\n[1, 2]\n")
    with pytest.raises(TraceError, match="line 2: a JSON list"):
        load_trace(notobj)
    # Validation errors in JSONL name the line too (blank line 2 is skipped).
    neg = tmp_path / "neg.jsonl"
    record = json.loads(rows[3])
    record["output_tokens"] = -4
    neg.write_text("\n".join([rows[0], "", rows[1], rows[2], json.dumps(record)]))
    with pytest.raises(TraceError, match=r"neg\.jsonl: line 5, column output_tokens: -4 — "):
        load_trace(neg)


def test_zero_rows(tmp_path):
    assert "no rows" in error_of(small_trace().iloc[0:0])
    path = tmp_path / "zero.parquet"
    small_trace().iloc[0:0].to_parquet(path)
    with pytest.raises(TraceError, match="no rows"):
        load_trace(path)


def test_missing_column_suggests_spelling():
    msg = error_of(small_trace().rename(columns={"env_seconds": "env_secs"}))
    assert "column 'env_seconds' is missing" in msg and "'env_secs'" in msg


@pytest.mark.parametrize(("col", "row", "value", "expect"), [
    ("prompt_tokens", 2, -1, r"row 3, column prompt_tokens: -1 — expected a whole number >= 0"),
    ("output_tokens", 4, 2.5, r"row 5, column output_tokens: 2.5 — expected a whole number"),
    ("output_tokens", 0, np.nan, r"row 1, column output_tokens: missing value"),
    ("output_tokens", 1, np.inf, r"row 2, column output_tokens: inf"),
    ("env_seconds", 3, -0.5, r"row 4, column env_seconds: -0.5 — expected a finite number"),
    ("env_seconds", 5, np.nan, r"row 6, column env_seconds: missing value"),
    ("turn", 1, "zero", r"row 2, column turn: 'zero' — expected a number"),
    ("task_id", 2, 1.5, r"row 3, column task_id: 1.5 — expected a string id"),
    ("trajectory_id", 0, None, r"row 1, column trajectory_id: missing value"),
    ("truncated", 1, "yes", r"row 2, column truncated: 'yes' — expected true or false"),
])
def test_bad_values_name_row_column_value(col, row, value, expect):
    df = small_trace()
    df[col] = df[col].astype(object)
    df.loc[row, col] = value
    assert pytest.importorskip("re").search(expect, error_of(df))


def test_first_offending_row_is_reported():
    df = small_trace()
    df.loc[[1, 4], "prompt_tokens"] = -3
    assert "row 2, column prompt_tokens" in error_of(df)


def test_turn_gaps_and_duplicates():
    df = small_trace()
    df.loc[0, "turn"] = 2  # t1 now has turns 0, 2
    msg = error_of(df)
    assert "row 1, column turn: 2 — expected turn 1" in msg and "'t1'" in msg
    df = small_trace()
    df.loc[3, "turn"] = 0  # t2 has turn 0 twice
    assert "row 4, column turn: 0 — expected each turn once" in error_of(df)
    df = small_trace()
    df.loc[[4, 5], "turn"] = [1, 2]  # t3 does not start at 0
    assert "row 5, column turn: 1 — expected turn 0" in error_of(df)


def test_trajectory_reused_under_two_tasks():
    df = small_trace()
    df.loc[5, "task_id"] = "a"
    msg = error_of(df)
    assert "row 6, column task_id: 'a' — expected 'b'" in msg


def test_branching_errors():
    df = small_trace()
    df.loc[[2, 3], "parent_trajectory_id"] = "nope"
    assert "row 3, column parent_trajectory_id: 'nope'" in error_of(df)
    df = small_trace()
    df["branch_turn"] = df["branch_turn"].astype(object)
    df.loc[[2, 3], "branch_turn"] = None
    assert "row 3, column branch_turn: missing value — expected the turn" in error_of(df)
    df = small_trace()
    df.loc[[2, 3], "branch_turn"] = 3
    assert "row 3, column branch_turn: 3 — expected 0..2" in error_of(df)
    df = small_trace()
    df.loc[[4, 5], "parent_trajectory_id"] = "t1"
    df.loc[[4, 5], "branch_turn"] = 0
    assert "same task 'b'" in error_of(df)
    df = small_trace()
    df.loc[[2, 3], "prompt_tokens"] = [99, 70]  # shared turn 0 differs from parent
    msg = error_of(df)
    assert "row 3, column prompt_tokens: 99 — expected 100" in msg and "parent 't1'" in msg


def test_branching_cycle():
    df = small_trace()
    df.loc[[0, 1], "parent_trajectory_id"] = "t2"
    df.loc[[0, 1], "branch_turn"] = 1
    msg = error_of(df)
    assert "branching cycle" in msg and "t1 -> t2 -> t1" in msg


def test_integer_ids_and_float_tokens_are_accepted():
    df = small_trace()
    df["task_id"] = [1, 1, 1, 1, 2, 2]
    df["prompt_tokens"] = df["prompt_tokens"].astype(float)
    out = validate_trace(df, "mem")
    assert out["task_id"].tolist()[0] == "1"
    assert out["prompt_tokens"].dtype == np.int64


def test_validation_is_vectorised_on_a_million_rows():
    n_traj, turns = 20_000, 50
    df = pd.DataFrame({
        "task_id": np.repeat(np.arange(n_traj) // 8, turns).astype(str),
        "trajectory_id": np.repeat(np.arange(n_traj), turns).astype(str),
        "turn": np.tile(np.arange(turns), n_traj),
        "prompt_tokens": np.ones(n_traj * turns, dtype=np.int64),
        "output_tokens": np.ones(n_traj * turns, dtype=np.int64),
        "env_seconds": np.zeros(n_traj * turns),
    })
    import time

    t0 = time.perf_counter()
    out = validate_trace(df, "big")
    assert len(out) == 1_000_000
    assert time.perf_counter() - t0 < 20


def test_row_groups_hold_whole_trajectories_and_tasks_load_alone(tmp_path, monkeypatch):
    from rlsched.traces import generate_trace, load

    monkeypatch.setattr(load, "TRAJECTORIES_PER_ROW_GROUP", 16)
    df = generate_trace("longtail-small", seed=0, tasks=8)  # 64 trajectories -> 4 groups
    path = write_trace(df, tmp_path / "pool.parquet")
    pf = pq.ParquetFile(path)
    assert pf.metadata.num_row_groups == 4
    firsts = [pf.read_row_group(i, columns=["turn"]).column(0)[0].as_py() for i in range(4)]
    assert firsts == [0, 0, 0, 0]  # every row group starts a trajectory
    part = load_trace(path, tasks=["t0002", "t0003"])
    pd.testing.assert_frame_equal(
        part, df[df["task_id"].isin(["t0002", "t0003"])].reset_index(drop=True))
    with pytest.raises(TraceError, match="column 'step' is missing"):
        load_trace(path, steps=[0])


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_a_write_stopped_part_way_leaves_no_trace_file(tmp_path, suffix, monkeypatch):
    """(A Ctrl-C during ``trace gen``'s write left a valid Parquet file of the row groups
    written so far: a shorter trace nothing marked as one.) The file appears whole or not
    at all; a trace already there is kept."""
    import pyarrow.parquet as pq

    target = tmp_path / f"t{suffix}"
    write_trace(small_trace(), target)
    before = target.read_bytes()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pq.ParquetWriter, "write_table", interrupted)
    monkeypatch.setattr(pd.DataFrame, "to_json", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_trace(small_trace(), target)
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]
    fresh = tmp_path / f"new{suffix}"
    with pytest.raises(KeyboardInterrupt):
        write_trace(small_trace(), fresh)
    assert not fresh.exists() and sorted(p.name for p in tmp_path.iterdir()) == [target.name]
