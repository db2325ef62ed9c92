"""RunRecorder: interval rows through its typed buffers, across row-group flushes."""

from __future__ import annotations

import pandas as pd
import pyarrow.parquet as pq
import pytest

from rlsched.cluster.config import RunConfig
from rlsched.cluster.record import GPU_STATE_CODE, INTERVAL_SCHEMA, RunRecorder, read_run
from rlsched.policies import make_policy
from rlsched.sim.cost import CostModel
from rlsched.sim.driver import SimDriver

from simkit import synthetic


def _close(rec: RunRecorder) -> None:
    rec.close(pd.DataFrame(), pd.DataFrame(), {"driver": "sim"})


def test_rows_written_by_call_and_by_buffer_keep_their_order_across_flushes(tmp_path):
    rec = RunRecorder(tmp_path, flush_rows=3)
    first, count, start, end, state, step, n = rec.interval_buffers()
    expected = []
    for k in range(8):
        row = (k, 2, float(k), k + 0.5, "generate" if k % 2 else "tool_wait", k % 3 - 1)
        expected.append(row)
        if k % 3 == 0:
            rec.interval(*row)
        else:  # what the simulator's per-turn code does
            i = n[0]
            first[i], count[i], start[i], end[i] = row[:4]
            state[i], step[i] = GPU_STATE_CODE[row[4]], row[5]
            n[0] = i + 1
            rec.flush_full()
    rec.interval(9, 1, 5.0, 5.0, "idle")  # empty: not written
    _close(rec)
    assert rec.interval_rows == 8
    table = pq.read_table(tmp_path / "intervals.parquet")
    assert table.schema.equals(INTERVAL_SCHEMA)
    assert table.num_rows == 8 and pq.ParquetFile(tmp_path / "intervals.parquet").num_row_groups == 3
    got = list(zip(*(table.column(c).to_pylist() for c in INTERVAL_SCHEMA.names), strict=True))
    assert got == expected
    assert list(read_run(tmp_path, tables=("intervals",)).intervals["state"][:2]) == ["tool_wait", "generate"]


def test_several_ranges_of_one_interval_split_across_flushes(tmp_path):
    from array import array

    rec = RunRecorder(tmp_path, flush_rows=3)
    rec.interval(40, 1, 0.0, 1.0, "idle")
    rec.intervals(array("i", [0, 4, 8, 12, 16, 20, 24]), array("i", [2, 1, 3, 1, 1, 2, 4]),
                  1.0, 2.5, "train", 3)
    rec.intervals(array("i", [0]), array("i", [2]), 2.5, 2.5, "train", 3)  # empty: not written
    _close(rec)
    table = pq.read_table(tmp_path / "intervals.parquet")
    assert pq.ParquetFile(tmp_path / "intervals.parquet").num_row_groups == 3
    got = list(zip(*(table.column(c).to_pylist() for c in INTERVAL_SCHEMA.names), strict=True))
    assert got == [(40, 1, 0.0, 1.0, "idle", -1)] + [
        (f, c, 1.0, 2.5, "train", 3) for f, c in zip([0, 4, 8, 12, 16, 20, 24], [2, 1, 3, 1, 1, 2, 4], strict=True)]
    with pytest.raises(ValueError, match="interval state 'napping'"):
        rec.intervals(array("i", [0]), array("i", [1]), 0.0, 1.0, "napping")


def test_bad_interval_state_and_flush_size_are_refused(tmp_path):
    rec = RunRecorder(tmp_path / "a")
    with pytest.raises(ValueError, match=r"interval state 'napping': expected one of generate, tool_wait"):
        rec.interval(0, 1, 0.0, 1.0, "napping")
    with pytest.raises(ValueError, match="flush_rows=0"):
        RunRecorder(tmp_path / "b", flush_rows=0)


@pytest.mark.parametrize("spec", ["colocated", "elastic"])
def test_simulated_record_does_not_depend_on_the_row_group_size(tmp_path, spec):
    """The per-turn code writes the recorder's buffers itself and flushes when they are
    full: a buffer of 7 rows (hundreds of flushes) gives the record one big buffer gives."""
    w, batches = synthetic(24, 6, steps=2)
    tables = []
    for rows in (7, 200_000):
        rec = RunRecorder(tmp_path / f"{spec}-{rows}", flush_rows=rows)
        SimDriver(w, batches, make_policy(spec), RunConfig(gpus=8, tp=2, steps=2), CostModel(),
                  recorder=rec).run()
        _close(rec)
        tables.append(pq.read_table(rec.dir / "intervals.parquet"))
    small, big = tables
    assert small.num_rows > 100
    assert small.equals(big)
