"""The analysis on a record the real simulator wrote, for a timeline computed by hand in
tests/test_sim_timeline.py (decode 1 s per token, role switch 1 s, training ~0)."""

import pytest

from rlsched.analysis.breakdown import breakdown, bubble_lengths
from rlsched.analysis.load import load_run
from rlsched.analysis.metrics import summarize

from simkit import ABC, APPROX, run


def test_colocated_record_by_hand(tmp_path):
    # t=0-1 both GPUs switch; e0 decodes A and C (C ends 3, A ends 4), then waits for e1:
    # B's turn 0 ends 2, tool 2-4, turn 1 ends 5. t=5-6 switch to train; training ~0.
    run(ABC, [["A", "B", "C"]], "colocated", out_dir=tmp_path / "r")
    rec = load_run(tmp_path / "r")
    row = summarize(rec)
    assert row["sim_seconds"] == pytest.approx(6.0, **APPROX)
    assert row["gpu_utilization"] == pytest.approx(5.0 / 12.0, **APPROX)
    assert (row["lost_trajectories"], row["max_staleness"], row["steps"]) == (0, 0, 1)
    assert row["lower_bound_seconds"] <= row["sim_seconds"]
    bd = breakdown(rec).set_index("cause")["gpu_seconds"]
    assert bd["generating"] == pytest.approx(5.0, **APPROX)
    assert bd["waiting on tools"] == pytest.approx(2.0, **APPROX)
    assert bd["waiting on the long tail"] == pytest.approx(1.0, **APPROX)  # e0, 4-5, while B runs
    assert bd["no rollout work"] == pytest.approx(0.0, **APPROX)
    assert bd["switching roles"] == pytest.approx(4.0, **APPROX)
    assert bd.sum() == pytest.approx(12.0, **APPROX)
    # GPU0 idle 0-1 and 4-6 (minus the ~1e-9 s of training at the very end); GPU1 0-1,
    # 2-4 (tool time) and 5-6
    b = bubble_lengths(rec)
    assert (b.gpu_count == 1).all()
    assert b[b.gpu_first == 0].seconds.tolist() == pytest.approx([1.0, 2.0], abs=1e-6)
    assert b[b.gpu_first == 1].seconds.tolist() == pytest.approx([1.0, 2.0, 1.0], abs=1e-6)
