"""Loading only the tasks a run needs, a chunk at a time (sim/workload.py): the arrays are
the ones the whole-file path gives, and bad input fails with one TraceError line."""

import pandas as pd
import pytest

from rlsched.cluster.errors import TraceError
from rlsched.sim.workload import Workload, load_workload, trace_index
from rlsched.traces import draw_batches, load_trace, sample_trace_path, write_trace


def test_index_and_chunked_load_match_the_whole_trace():
    path = sample_trace_path()
    whole = load_trace(path)
    idx = trace_index(path)
    first = whole.drop_duplicates("trajectory_id")
    assert list(idx.trajectory_id) == list(first.trajectory_id)
    assert list(idx.task_id) == list(first.task_id)
    assert idx.rows.sum() == len(whole)
    batches = draw_batches(whole, 3)
    assert [list(b) for b in draw_batches(idx, 3)] == [list(b) for b in batches]
    ref = Workload.from_frame(whole)
    w = load_workload(path, batches, idx, rows_per_chunk=500)  # many chunks
    used = {t for b in batches for _, t in b}
    assert used <= set(w.trajectory_ids)
    for t in used:
        i, j = w.index[t], ref.index[t]
        assert w.turn_lists(i) == ref.turn_lists(j)
        assert (w.turns[i], w.truncated[i], w.task_ids[i], w.parent[i], w.branch_turn[i]) == (
            ref.turns[j], ref.truncated[j], ref.task_ids[j], ref.parent[j], ref.branch_turn[j])


def test_trajectory_split_across_row_groups_is_one_index_row(tmp_path):
    df = pd.DataFrame({
        "task_id": ["a"] * 3 + ["b"] * 2, "trajectory_id": ["x"] * 3 + ["y"] * 2,
        "turn": [0, 1, 2, 0, 1], "prompt_tokens": 5, "output_tokens": 2, "env_seconds": 1.0,
    })
    p = tmp_path / "t.parquet"
    df.to_parquet(p, row_group_size=2)  # x spans row groups 0 and 1
    idx = trace_index(p)
    assert list(idx.trajectory_id) == ["x", "y"] and list(idx.rows) == [3, 2]
    w = load_workload(p, [[("x", "x")], [("y", "y")]], idx, rows_per_chunk=1)
    assert w.turn_lists(w.index["x"]) == ([5, 5, 5], [2, 2, 2], [1.0, 1.0, 1.0])


def test_bad_input_is_one_trace_error(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(TraceError, match=r"bad\.parquet"):
        trace_index(bad)
    nocol = tmp_path / "nocol.parquet"
    pd.DataFrame({"trajectory_id": ["x"], "turn": [0]}).to_parquet(nocol)
    with pytest.raises(TraceError, match="task_id"):
        trace_index(nocol)
    good = tmp_path / "good.parquet"
    write_trace(pd.DataFrame({
        "task_id": ["a"], "trajectory_id": ["x"], "turn": [0], "prompt_tokens": [1],
        "output_tokens": [1], "env_seconds": [0.0],
    }), good)
    with pytest.raises(TraceError, match="'nope' is not in the trace"):
        load_workload(good, [[("nope", "nope")]])
