"""A run record whose numeric columns were rewritten as text is one ``RecordError`` line
naming the file and column (it was a TypeError deep in the report's step times and
critical path)."""

from __future__ import annotations

import pandas as pd
import pytest

from rlsched.analysis.load import load_run
from rlsched.cluster.errors import RecordError

from simkit import ABC, run


@pytest.mark.parametrize(("name", "column"), [
    ("steps.parquet", "version"),
    ("trajectories.parquet", "trained_version"),
    ("trajectories.parquet", "step"),
])
def test_text_in_a_number_column_is_one_line(tmp_path, name, column):
    run(ABC, [["A", "B", "C"]], "colocated", out_dir=tmp_path / "r")
    assert load_run(tmp_path / "r")  # (the record as written reads)
    f = tmp_path / "r" / name
    df = pd.read_parquet(f)
    df[column] = df[column].astype(str)
    df.to_parquet(f)
    with pytest.raises(RecordError, match=rf"{name}: column {column} holds .* values: expected numbers"):
        load_run(tmp_path / "r")


def test_a_nan_interval_end_is_a_plain_line(tmp_path):
    """(It printed ``end=np.float64(nan)``.)"""
    run(ABC, [["A", "B", "C"]], "colocated", out_dir=tmp_path / "r")
    f = tmp_path / "r" / "intervals.parquet"
    df = pd.read_parquet(f)
    df.loc[0, "end"] = float("nan")
    df.to_parquet(f)
    with pytest.raises(RecordError, match=r"intervals.parquet: row 0: end=nan before start=[\d.]+ \(expected"):
        load_run(tmp_path / "r")
