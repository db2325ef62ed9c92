"""Metrics on hand-built run records whose every number is known (tests/conftest_analysis.py)."""

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest_analysis import HAND_INTERVALS, HAND_TRAJS, write_run

from rlsched.analysis.breakdown import breakdown, bubble_lengths, bubbles
from rlsched.analysis.load import load_run
from rlsched.analysis.metrics import (
    SUMMARY_COLUMNS,
    length_bias,
    staleness_table,
    step_times,
    summarize,
    waste_table,
)
from rlsched.cluster.errors import RecordError
from rlsched.cluster.record import read_run

EXACT = dict(rel=1e-12, abs=1e-12)


@pytest.fixture
def hand(tmp_path):
    return load_run(write_run(tmp_path / "hand"))


def test_summary_row_exact(hand):
    row = summarize(hand)
    assert list(row)[:8] == list(SUMMARY_COLUMNS)[:8]
    assert tuple(row) == SUMMARY_COLUMNS
    assert row["policy"] == "hand:k=2"
    assert row["steps"] == 2
    assert row["sim_seconds"] == 10.0
    assert row["trained_tokens"] == 30 + 60 + 90
    assert row["gpu_utilization"] == pytest.approx(9 / 20, **EXACT)
    assert row["idle_fraction"] == pytest.approx(6 / 20, **EXACT)
    assert row["max_staleness"] == 2
    assert row["lost_trajectories"] == 0
    assert row["lower_bound_seconds"] == 8.0
    assert row["gap_to_bound_pct"] == pytest.approx(25.0, **EXACT)
    assert row["steps_per_hour"] == pytest.approx(2 / (10 / 3600), **EXACT)
    assert row["trained_tokens_per_gpu_hour"] == pytest.approx(180 / (2 * 10 / 3600), **EXACT)
    assert row["dropped_trajectories"] == 1
    assert row["wasted_tokens"] == 85
    assert row["saved_tokens"] == 0
    assert "wall_seconds" not in row  # host time (a live meta has it) stays out of summary.csv
    assert row["events_processed"] == 123


def test_summarize_accepts_read_run_records(tmp_path):
    # rlsched compare hands summarize() what read_run returns (all events loaded)
    rec = read_run(write_run(tmp_path / "r"))
    assert summarize(rec)["gpu_utilization"] == pytest.approx(0.45, **EXACT)


def test_breakdown_by_state_and_cause_exact(hand):
    bd = breakdown(hand)
    got = {(s, c): v for s, c, v in zip(bd.state, bd.cause, bd.gpu_seconds, strict=True)}
    want = {
        ("generate", "generating"): 7.0,
        ("tool_wait", "waiting on tools"): 1.5,
        ("tool_wait", "waiting on a saturated sandbox pool"): 1.5,
        ("rollout_idle", "waiting on the long tail"): 2.0,
        ("rollout_idle", "no rollout work"): 1.0,
        ("sync", "weight sync"): 1.0,
        ("switch", "switching roles"): 1.0,
        ("train", "training"): 2.0,
        ("train_idle", "trainer waiting for data"): 2.0,
        ("idle", "idle (no role)"): 1.0,
    }
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k] == pytest.approx(v, **EXACT), k
    assert bd.fraction.sum() == pytest.approx(1.0, **EXACT)
    assert (bd.fraction == bd.gpu_seconds / 20).all()
    assert "SyncStart/SyncEnd" in bd.set_index("state").loc["sync", "note"]


def test_sandbox_estimated_without_acquired_events(tmp_path):
    # queue events at 4.2 and 5.8 (one burst): saturated span [4.2, 5.8] is an estimate
    ev = [(4.2, "SandboxQueued", {"trajectory": "b"}), (5.8, "SandboxQueued", {"trajectory": "c"})]
    bd = breakdown(load_run(write_run(tmp_path / "r", events=ev))).set_index("cause")
    sat = bd.loc["waiting on a saturated sandbox pool"]
    # GPU0 tool_wait [5,6) -> 0.8; GPU1 [4,6) -> 1.6
    assert sat.gpu_seconds == pytest.approx(2.4, **EXACT)
    assert "estimated" in sat.note


def test_unrecorded_time_shows_in_breakdown(tmp_path):
    iv = [(0, 2, 0.0, 4.0, "generate", -1), (0, 1, 4.0, 10.0, "train", 0)]  # GPU1 4..10 missing
    bd = breakdown(load_run(write_run(tmp_path / "r", intervals=iv, events=[]))).set_index("state")
    assert bd.loc["unrecorded", "gpu_seconds"] == pytest.approx(6.0, **EXACT)
    assert bd.fraction.sum() == pytest.approx(1.0, **EXACT)


def test_bubbles_exact(hand):
    b = bubble_lengths(hand)
    assert b.to_dict("list") == {"gpu_first": [0, 1], "gpu_count": [1, 1], "start": [5.0, 2.0], "seconds": [3.0, 8.0]}
    s = bubbles(hand)
    assert s["bubbles"] == 2
    assert s["total_gpu_seconds"] == 11.0
    assert (s["longest_seconds"], s["longest_gpu"], s["longest_start"]) == (8.0, 1, 2.0)


def test_bubbles_do_not_depend_on_interval_order(tmp_path):
    rec = load_run(write_run(tmp_path / "r", intervals=HAND_INTERVALS[::-1]))
    assert bubble_lengths(rec).to_dict("list") == {
        "gpu_first": [0, 1], "gpu_count": [1, 1], "start": [5.0, 2.0], "seconds": [3.0, 8.0]
    }
    assert breakdown(rec).gpu_seconds.tolist() == breakdown(load_run(write_run(tmp_path / "h"))).gpu_seconds.tolist()


def test_bubbles_edges_gaps_and_never_busy_gpus(tmp_path):
    # GPU0: idle 0-1, generate 1-2, (gap) 2-3, generate 3-4, idle to 10
    # GPU1: train 0-10 (no bubble); GPU2: only idle -> one 10 s bubble
    iv = [
        (0, 1, 0.0, 1.0, "idle", -1), (0, 1, 1.0, 2.0, "generate", -1),
        (0, 1, 3.0, 4.0, "generate", -1), (0, 1, 4.0, 10.0, "idle", -1),
        (1, 1, 0.0, 10.0, "train", 0), (2, 1, 0.0, 10.0, "idle", -1),
    ]
    rec = load_run(write_run(tmp_path / "r", intervals=iv, events=[], num_gpus=3))
    b = bubble_lengths(rec)
    assert list(zip(b.gpu_first, b.gpu_count, b.start, b.seconds, strict=True)) == [
        (0, 1, 0.0, 1.0), (0, 1, 2.0, 1.0), (0, 1, 4.0, 6.0), (2, 1, 0.0, 10.0)
    ]


def test_bubbles_are_per_gpu_range_and_counted_per_gpu(tmp_path):
    # two engines of 4 GPUs (0-3, 4-7) generate at different times, then all 8 train
    # together; GPUs 8-9 never work. Engine 0: bubble 4-6; engine 1: 0-2; GPUs 8-9: 0-10.
    iv = [
        (0, 4, 0.0, 4.0, "generate", -1), (0, 4, 4.0, 6.0, "rollout_idle", -1),
        (4, 4, 0.0, 2.0, "rollout_idle", -1), (4, 4, 2.0, 6.0, "generate", -1),
        (0, 8, 6.0, 10.0, "train", 0), (8, 2, 0.0, 10.0, "idle", -1),
    ]
    rec = load_run(write_run(tmp_path / "r", intervals=iv, events=[], num_gpus=10))
    b = bubble_lengths(rec)
    assert list(zip(b.gpu_first, b.gpu_count, b.start, b.seconds, strict=True)) == [
        (0, 4, 4.0, 2.0), (4, 4, 0.0, 2.0), (8, 2, 0.0, 10.0)
    ]
    s = bubbles(rec)
    assert (s["bubbles"], s["total_gpu_seconds"], s["longest_gpu"]) == (10, 4 * 2 + 4 * 2 + 2 * 10, 8)
    assert (s["p50_seconds"], s["p90_seconds"]) == (2.0, 10.0)  # 8 bubbles of 2 s, 2 of 10 s


def test_staleness_distribution_and_costs(hand):
    st = staleness_table(hand)
    assert st[["staleness", "trajectories", "trained_tokens"]].to_dict("list") == {
        "staleness": [0, 1, 2], "trajectories": [1, 1, 1], "trained_tokens": [30, 60, 90]
    }
    assert st.fraction.sum() == pytest.approx(1.0)
    w = waste_table(hand)
    assert (w["dropped"], w["resumes"], w["migrations"], w["evictions"], w["timed_out"]) == (1, 1, 1, 2, 1)
    assert (w["wasted_tokens"], w["dropped_tokens"], w["sandbox_queued"]) == (85, 80, 1)


def test_step_times(hand):
    s = step_times(hand)
    assert s[["step", "seconds"]].to_dict("list") == {"step": [0, 1], "seconds": [5.0, 5.0]}


def test_length_bias_per_step(hand):
    lb = length_bias(hand).set_index("step")
    # step 0: batch {a:2, b:4} mean 3; trained in step 0: a (2) -> -33%
    assert lb.loc[0, "batch_mean_turns"] == 3.0
    assert lb.loc[0, "trained_mean_turns"] == 2.0
    assert lb.loc[0, "bias_pct"] == pytest.approx(-100 / 3)
    # step 1 trains b (4); step 2 trains c (6)
    assert lb.loc[1, "trained_mean_turns"] == 4.0
    assert lb.loc[2, "trained_mean_turns"] == 6.0


def test_saved_tokens_when_processor_ran(tmp_path):
    trajs = [list(t) for t in HAND_TRAJS]
    trajs[2][14] = 50  # c: 90 kept context tokens, charged 50 after prefix sharing
    rec = load_run(write_run(tmp_path / "r", trajectories=[tuple(t) for t in trajs],
                             config={"processor": True}))
    assert summarize(rec)["saved_tokens"] == 40
    rec_off = load_run(write_run(tmp_path / "o", trajectories=[tuple(t) for t in trajs]))
    assert summarize(rec_off)["saved_tokens"] == 0


def test_lost_trajectories_complete_and_incomplete(tmp_path):
    trajs = [list(t) for t in HAND_TRAJS]
    trajs[3][3] = "done"  # d finished generating but was neither trained nor dropped
    trajs = [tuple(t) for t in trajs]
    complete = load_run(write_run(tmp_path / "c", trajectories=trajs))
    assert summarize(complete)["lost_trajectories"] == 1
    # stopped after step 0: d belongs to step 1, still in progress -> in flight, not lost
    partial = load_run(write_run(tmp_path / "p", trajectories=trajs, complete=False, steps_done=1))
    row = summarize(partial)
    assert row["lost_trajectories"] == 0
    assert row["unfinished_trajectories"] == 1
    # stopped after step 1: d's step has trained -> lost; unless it was carried over
    assert summarize(load_run(write_run(tmp_path / "q", trajectories=trajs, complete=False)))["lost_trajectories"] == 1
    carried = [t if t[0] != "d" else (*t[:3], "interrupted", *t[4:]) for t in trajs]
    assert summarize(load_run(write_run(tmp_path / "k", trajectories=carried, complete=False)))["lost_trajectories"] == 0


def test_intervals_past_makespan_are_clipped(tmp_path):
    iv = [(0, 2, 0.0, 12.0, "generate", -1)]
    row = summarize(load_run(write_run(tmp_path / "r", intervals=iv, events=[])))
    assert row["gpu_utilization"] == pytest.approx(1.0, **EXACT)


def test_missing_lower_bound_is_nan(tmp_path):
    row = summarize(load_run(write_run(tmp_path / "r", lower_bound_seconds=None)))
    assert np.isnan(row["lower_bound_seconds"]) and np.isnan(row["gap_to_bound_pct"])


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: (d / "intervals.parquet").write_bytes(b"garbage"), "intervals.parquet: corrupt"),
        (lambda d: (d / "events.parquet").write_bytes(b"garbage"), "events.parquet"),
        (lambda d: (d / "steps.parquet").unlink(), "missing steps.parquet"),
        (lambda d: _edit_meta(d, version=99), "newer than this rlsched reads"),
        (lambda d: _edit_meta(d, num_gpus=0), "num_gpus=0"),
        (lambda d: _edit_meta(d, makespan_seconds="long"), "makespan_seconds='long'"),
        (lambda d: _edit_meta(d, policy=None), "policy=None"),
        (lambda d: (d / "meta.json").write_text("{"), "meta.json: unreadable"),
        (lambda d: pd.DataFrame({"version": [1]}).to_parquet(d / "steps.parquet"), "missing column(s) time"),
    ],
)
def test_bad_records_are_one_line_errors(tmp_path, mutate, needle):
    d = write_run(tmp_path / "r")
    mutate(d)
    with pytest.raises(RecordError) as exc:
        load_run(d)
    msg = str(exc.value)
    assert needle in msg and "\n" not in msg and str(d) in msg


def test_unknown_state_and_out_of_range_gpus(tmp_path):
    # (RunRecorder refuses such a state: the record stands for one another tool wrote)
    d = write_run(tmp_path / "s", intervals=[(0, 2, 0.0, 10.0, "idle", -1)])
    pq.write_table(pa.table({"gpu_first": pa.array([0], pa.int32()), "gpu_count": pa.array([2], pa.int32()),
                             "start": [0.0], "end": [10.0], "state": ["napping"],
                             "step": pa.array([-1], pa.int32())}), d / "intervals.parquet")
    with pytest.raises(RecordError, match=r"row 0: state='napping'"):
        load_run(d)
    d = write_run(tmp_path / "g", intervals=[(1, 2, 0.0, 10.0, "idle", -1)])
    with pytest.raises(RecordError, match=r"GPUs 1\.\.2 outside the cluster's 2 GPUs"):
        load_run(d)


def _edit_meta(d, **kw):
    meta = json.loads((d / "meta.json").read_text())
    meta.update(kw)
    (d / "meta.json").write_text(json.dumps(meta))
