"""Issue 23 item 5: summary.csv splits the gap to the bound by cause, exactly."""

from __future__ import annotations

import math

import pytest

from rlsched.analysis.metrics import GAP_CAUSES, SUMMARY_COLUMNS, summarize
from rlsched.cluster.config import RunConfig
from rlsched.cluster.record import read_run
from rlsched.policies import make_policy
from rlsched.sim.run import simulate

from simkit import HAND_COST, synthetic

CAUSES = (*GAP_CAUSES, "gap_other_s")


@pytest.mark.parametrize("spec", ["colocated", "async:staleness=1", "elastic", "partial"])
def test_the_gap_splits_exactly_into_its_causes(tmp_path, spec):
    w, batches = synthetic(6, 3, steps=3)
    config = RunConfig(gpus=4, tp=1, steps=3)
    out = simulate(w, batches, make_policy(spec), config, HAND_COST, out_dir=tmp_path / "run", spec=spec)
    row = summarize(read_run(tmp_path / "run"))
    assert {"gap_seconds", *CAUSES} <= set(SUMMARY_COLUMNS)
    assert row["gap_seconds"] == pytest.approx(out.result.makespan - out.lower_bound_seconds)
    assert sum(row[c] for c in CAUSES) == pytest.approx(row["gap_seconds"], rel=1e-9, abs=1e-9)
    for c in CAUSES:
        assert 0.0 <= row[c] <= row["gap_seconds"] + 1e-9
    assert not any(math.isnan(row[c]) for c in CAUSES)
