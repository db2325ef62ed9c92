"""Exact timelines on tiny traces, computed by hand (see tests/simkit.py: decode = 1 s per
token per sequence, role switch = 1 s, everything else ~0)."""

import pytest

from rlsched.cluster.record import read_run

from simkit import ABC, APPROX, run, trace


def test_colocated_timeline_by_hand(tmp_path):
    # t=0 switch (1 s) -> t=1 dispatch: A->e0, B->e1, C->e0 (least loaded, lowest id).
    # e0 decodes A and C together at 1 tok/s each: C ends t=3, A ends t=4.
    # e1: B turn 0 ends t=2, tool until t=4, turn 1 ends t=5.
    # t=5 all done -> switch to train (1 s) -> t=6 train (~0) -> step 1 done.
    out = run(ABC, [["A", "B", "C"]], "colocated", out_dir=tmp_path / "r")
    rec = read_run(tmp_path / "r")
    fin = rec.events[rec.events.kind == "TrajectoryFinished"]
    assert list(fin.trajectory) == ["C", "A", "B"]
    assert list(fin.time) == pytest.approx([3.0, 4.0, 5.0], **APPROX)
    assert out.result.makespan == pytest.approx(6.0, **APPROX)
    iv = rec.intervals.assign(gs=lambda d: (d.end - d.start) * d.gpu_count)
    by_state = iv.groupby("state").gs.sum()
    assert by_state["switch"] == pytest.approx(4.0, **APPROX)
    assert by_state["generate"] == pytest.approx(3.0 + 2.0, **APPROX)
    assert by_state["tool_wait"] == pytest.approx(2.0, **APPROX)
    assert by_state["rollout_idle"] == pytest.approx(1.0, **APPROX)
    # intervals of each GPU tile [0, makespan] exactly
    for g in (0, 1):
        mine = iv[(iv.gpu_first <= g) & (g < iv.gpu_first + iv.gpu_count)].sort_values("start")
        assert mine.start.iloc[0] == 0.0
        assert (mine.start.to_numpy()[1:] == mine.end.to_numpy()[:-1]).all()
        assert mine.end.iloc[-1] == pytest.approx(6.0, **APPROX)
    assert rec.meta["lower_bound_seconds"] <= out.result.makespan
    assert set(rec.trajectories.status) == {"trained"}


def test_async_overlaps_next_batch_with_staleness_one():
    # one engine (GPU 0) and one trainer GPU. k=1: steps 0 and 1 dispatched together at
    # t=1; B (1 token) and A (2 tokens) share the engine: B ends t=2, A ends t=3; both
    # steps train at ~t=3.
    df = trace([("t", "A", 0, 1, 2, 0.0), ("u", "B", 0, 1, 1, 0.0)])
    out = run(df, [["A"], ["B"]], "async:rollout_fraction=0.5,staleness=1")
    assert out.result.makespan == pytest.approx(3.0, **APPROX)
    st = out.result.state
    assert st.trajs["B"].trained_version - st.trajs["B"].min_version == 1


def test_async_staleness_zero_is_sequential():
    # k=0: B may only start once version 1 reaches the engine: A ends t=3, B ends t=4.
    df = trace([("t", "A", 0, 1, 2, 0.0), ("u", "B", 0, 1, 1, 0.0)])
    out = run(df, [["A"], ["B"]], "async:rollout_fraction=0.5,staleness=0")
    assert out.result.makespan == pytest.approx(4.0, **APPROX)
    assert all(t.trained_version == t.min_version for t in out.result.state.trajs.values())


def test_kv_capacity_queues_then_admits():
    # capacity 1000 tokens: X (600) and Y (600) cannot share one engine; with one engine
    # (2 GPUs, async gives 1 to rollout) Y waits until X finishes.
    from dataclasses import replace

    from simkit import HAND_COST

    cost = replace(HAND_COST, kv_bytes_per_elem=0.5, gpu_mem_util=1.0, hbm_bytes=1e9 + 1000)
    assert cost.kv_capacity_tokens(1) == 1000
    df = trace([("t", "X", 0, 598, 2, 0.0), ("t", "Y", 0, 598, 2, 0.0)])
    out = run(df, [["X", "Y"]], "async:rollout_fraction=0.5,staleness=0", cost=cost)
    fin = sorted((ts.finish_time, t) for t, ts in out.result.state.trajs.items())
    assert [t for _, t in fin] == ["X", "Y"]
    assert fin[0][0] == pytest.approx(3.0, **APPROX)
    assert fin[1][0] == pytest.approx(5.0, **APPROX)


def test_trajectory_over_kv_capacity_times_out_keeping_turns():
    from dataclasses import replace

    from simkit import HAND_COST

    cost = replace(HAND_COST, kv_bytes_per_elem=0.5, gpu_mem_util=1.0, hbm_bytes=1e9 + 1000)
    df = trace([("t", "X", 0, 500, 2, 1.0), ("t", "X", 1, 800, 2, 0.0)])
    out = run(df, [["X"]], "colocated", cost=cost)
    x = out.result.state.trajs["X"]
    assert x.finish_status.value == "timed_out"
    assert x.turns_done == 1
    assert out.result.trajs["X"].ctx == 502


def test_partial_interrupt_in_tool_time_stays_above_bound():
    # T2 is interrupted during a 17 s tool call by the 3 s budget and resumed next step
    # without the rest of that call: the deferring policy's bound must not count it.
    df = trace([("task0", "T0", 0, 0, 0, 0.0), ("task1", "T1", 0, 0, 0, 0.0),
                ("task2", "T2", 0, 0, 0, 17.0), ("task2", "T2", 1, 0, 0, 0.0)])
    out = run(df, [["T0", "T2"], ["T1"]], "partial:finish_fraction=1.0,budget_s=3", sandbox_slots=1)
    assert out.result.makespan >= out.lower_bound_seconds


@pytest.mark.parametrize("spec", ["colocated", "elastic", "async:staleness=0", "partial"])
def test_the_last_turns_tool_call_is_part_of_the_trajectory(tmp_path, spec):
    # B's last turn is followed by a 3 s tool call (a submission running its tests): B is
    # done when that returns, not when its last token is generated. colocated: e1 runs B's
    # turn 0 1-2, tool 2-4, turn 1 4-5, final tool 5-8 (held in tool wait); training 8-9.
    df = ABC.copy()
    df.loc[(df.trajectory_id == "B") & (df.turn == 1), "env_seconds"] = 3.0
    out = run(df, [["A", "B", "C"]], spec, out_dir=tmp_path / "r")
    rec = read_run(tmp_path / "r")
    fin = rec.events[(rec.events.kind == "TrajectoryFinished") & (rec.events.trajectory == "B")]
    assert list(fin.detail) == ["done"]
    base = run(ABC, [["A", "B", "C"]], spec)
    b_base = base.result.state.trajs["B"].finish_time
    assert fin.time.iloc[0] == pytest.approx(b_base + 3.0, **APPROX)
    assert out.result.state.trajs["B"].turns_done == 2
    assert rec.meta["lower_bound_seconds"] <= out.result.makespan + 1e-9
    if spec == "colocated":
        assert fin.time.iloc[0] == pytest.approx(8.0, **APPROX)
        assert out.result.makespan == pytest.approx(9.0, **APPROX)
        iv = rec.intervals.assign(gs=lambda d: (d.end - d.start) * d.gpu_count)
        assert iv.groupby("state").gs.sum()["tool_wait"] == pytest.approx(2.0 + 3.0, **APPROX)


def test_bound_leaves_out_the_last_tool_call_of_a_trajectory_cut_in_it():
    """Found by test_sim_properties: partial rollout trained T0 while it waited on the tool
    call after its only turn (turns kept = all of them), and the bound still charged that
    call: 4 s, above the run's 2 s."""
    df = trace([("task0", "T0", 0, 0, 0, 3.0), ("task1", "T1", 0, 0, 0, 0.0),
                ("task2", "T2", 0, 0, 0, 0.0), ("task0", "T3", 0, 0, 0, 0.0)])
    out = run(df, [["T0", "T1", "T2", "T3"]], "partial:finish_fraction=0.5,mode=train",
              gpus=2, tp=1, sandbox_slots=1)
    assert out.result.complete
    assert out.result.makespan >= out.lower_bound_seconds - 1e-9
