"""Role-switch cost per direction and per GPU (``CostModel.switch_seconds``): the simulator
charges it, the defaults keep the old single ``switch_s``, and calibration fits it from
role-switch measurements (here synthetic: fake rows made from known constants)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from rlsched.calibration import fit_measurements
from rlsched.cluster.errors import ConfigError
from rlsched.cluster.record import read_run
from rlsched.sim.calibration import fit_switch
from rlsched.sim.cost import CostModel

from simkit import ABC, APPROX, HAND_COST, run


def _switch_ends(rec) -> list[tuple[float, str]]:
    ev = rec.events[rec.events.kind == "SwitchEnd"]
    return [(round(float(t), 6), str(d).split()[0]) for t, d in zip(ev.time, ev.detail, strict=True)]


def test_colocated_timeline_with_direction_costs_by_hand(tmp_path):
    # to rollout 3 s (t=0..3); e0 decodes A and C: C ends t=5, A t=6; e1: B's turn 0 ends
    # t=4, tool until t=6, turn 1 ends t=7; to train 2 s (t=7..9); training ~0.
    cost = replace(HAND_COST, switch_to_rollout_s=3.0, switch_to_train_s=2.0)
    out = run(ABC, [["A", "B", "C"]], "colocated", cost=cost, out_dir=tmp_path / "r")
    rec = read_run(tmp_path / "r")
    fin = rec.events[rec.events.kind == "TrajectoryFinished"]
    assert list(fin.time) == pytest.approx([5.0, 6.0, 7.0], **APPROX)
    # (both GPUs leave idle in one Reassign and switch together: one SwitchEnd for them;
    # to train, each engine switches once it has drained)
    assert _switch_ends(rec) == [(3.0, "rollout"), (9.0, "train"), (9.0, "train")]
    assert out.result.makespan == pytest.approx(9.0, **APPROX)
    iv = rec.intervals.assign(gs=lambda d: (d.end - d.start) * d.gpu_count)
    assert iv.groupby("state").gs.sum()["switch"] == pytest.approx(2 * 3.0 + 2 * 2.0, **APPROX)
    assert rec.meta["lower_bound_seconds"] <= out.result.makespan


def test_per_gpu_slope_counts_the_gpus_of_one_reassign(tmp_path):
    # colocated moves both GPUs in one Reassign (group of 2; tp=1, so one GPU per engine):
    # to rollout 3 + 0.5 * (2 - 1) = 3.5 s, to train 2 + 0.25 = 2.25 s -> 3.5 + 4 + 2.25.
    cost = replace(HAND_COST, switch_to_rollout_s=3.0, switch_to_train_s=2.0,
                   switch_to_rollout_per_gpu_s=0.5, switch_to_train_per_gpu_s=0.25)
    out = run(ABC, [["A", "B", "C"]], "colocated", cost=cost, out_dir=tmp_path / "r")
    assert _switch_ends(read_run(tmp_path / "r")) == [(3.5, "rollout"), (9.75, "train"), (9.75, "train")]
    assert out.result.makespan == pytest.approx(9.75, **APPROX)


def test_defaults_charge_switch_s_everywhere():
    c = CostModel()
    assert (c.switch_to_train_s, c.switch_to_rollout_s) == (0.0, 0.0)
    assert (c.switch_to_train_per_gpu_s, c.switch_to_rollout_per_gpu_s) == (0.0, 0.0)
    for role in ("train", "rollout", "idle"):
        for gpus in (1, 2, 8):
            assert c.switch_seconds(role, gpus) == c.switch_s == 8.0
    one = replace(c, switch_s=4.0, switch_to_train_s=5.0, switch_to_rollout_per_gpu_s=2.0)
    assert one.switch_seconds("train", 4) == 5.0  # a zero slope adds nothing
    assert one.switch_seconds("rollout", 4) == 4.0 + 3 * 2.0  # zero constant: switch_s
    assert one.switch_seconds("idle", 4) == 4.0  # no direction: switch_s, no slope


def test_explicit_zero_fields_give_the_same_timeline_as_before():
    base = run(ABC, [["A", "B", "C"]], "colocated")
    zeros = replace(HAND_COST, switch_to_train_s=0.0, switch_to_rollout_s=0.0,
                    switch_to_train_per_gpu_s=0.0, switch_to_rollout_per_gpu_s=0.0)
    again = run(ABC, [["A", "B", "C"]], "colocated", cost=zeros)
    assert base.result.makespan == again.result.makespan == pytest.approx(6.0, **APPROX)


@pytest.mark.parametrize("field", ["switch_to_train_s", "switch_to_rollout_s",
                                   "switch_to_train_per_gpu_s", "switch_to_rollout_per_gpu_s"])
def test_new_fields_are_range_checked(field):
    with pytest.raises(ConfigError, match=rf"{field}=-1\.0: must be > 0"):
        CostModel().with_overrides({field: -1.0})
    with pytest.raises(ConfigError, match=field):
        CostModel().with_overrides({field: 1e12})
    assert getattr(CostModel().with_overrides({field: 0}), field) == 0


def test_a_direction_cheaper_than_switch_s_is_one_line():
    """sim/bound.py charges ``switch_s`` as the cheapest switch; a cheaper direction would
    make the lower bound exceed the makespan (seen: bound 9 s for a 6 s run)."""
    with pytest.raises(ConfigError, match=r"switch_to_rollout_s=1\.0 is below switch_s=5\.0"):
        replace(HAND_COST, switch_s=5.0, switch_to_rollout_s=1.0)
    c = replace(HAND_COST, switch_s=1.0, switch_to_rollout_s=1.0, switch_to_train_s=1.0)
    out = run(ABC, [["A", "B", "C"]], "colocated", cost=c)
    assert out.lower_bound_seconds <= out.result.makespan


# ------------------------------------------------------------------------- the fit
FAKE = {"switch_to_train_s": 10.0, "switch_to_train_per_gpu_s": 9.0,
        "switch_to_rollout_s": 24.0, "switch_to_rollout_per_gpu_s": 40.0}


def fake_switch_rows(sizes=(1, 2, 4), repeats=3, noise=0.0, seed=0) -> pd.DataFrame:
    """Fake role-switch measurements from the known constants ``FAKE``."""
    truth = replace(CostModel(), **FAKE)
    rng = np.random.default_rng(seed)
    rows = []
    for kind, role in (("to_train", "train"), ("to_rollout", "rollout")):
        for g in sizes:
            for _ in range(repeats):
                t = truth.switch_seconds(role, g) * (1.0 + noise * rng.standard_normal())
                rows.append({"component": "switch", "kind": kind, "seconds": t, "gpus": g})
    return pd.DataFrame(rows)


def test_fit_recovers_direction_constants_and_slopes_from_fake_rows():
    cost, q, y, pred = fit_switch(fake_switch_rows(), CostModel())
    for name, value in FAKE.items():
        assert getattr(cost, name) == pytest.approx(value, rel=1e-3), name
    assert cost.switch_s == pytest.approx(10.0, rel=1e-3)  # the cheapest switch (bound.py)
    assert q.r2 > 0.999 and q.worst_residual_pct < 0.5
    assert set(q.fitted) == {*FAKE, "switch_s"}
    assert np.allclose(y, pred, rtol=1e-3)


def test_one_group_size_gives_medians_and_says_there_is_no_slope():
    rows = fake_switch_rows(sizes=(2,), noise=0.1, seed=1)
    rows.loc[rows.index[0], "seconds"] = 500.0  # one stalled switch must not drag it
    cost, q, _, _ = fit_switch(rows, CostModel())
    train = rows[rows.kind == "to_train"].seconds
    assert cost.switch_to_train_s == pytest.approx(float(train.median()))
    assert cost.switch_to_train_per_gpu_s == cost.switch_to_rollout_per_gpu_s == 0.0
    assert "at 2 GPUs only: no slope" in q.note
    assert q.worst_residual_s > 400  # the outlier is reported, not hidden


def test_noisy_fake_rows_show_in_quality():
    _, q, _, _ = fit_switch(fake_switch_rows(noise=0.2, seed=3), CostModel())
    assert q.r2 < 0.999 and q.worst_residual_pct > 5.0


def test_refit_of_old_measurements_without_gpus_uses_the_cluster_size():
    """Calibrations written before the ``gpus`` column moved the whole cluster at once."""
    from test_calibrate_fit import TINY, fake_rows, truth_model

    rows = fake_rows(truth_model())
    assert "gpus" not in rows.columns
    info = {"model_dir": "tiny", "on_gpus": False, "gpus": 2, "tp": 1, "seconds": 1.0,
            "machine_peaks": {"peak_flops": TINY["peak_flops"], "hbm_bw": TINY["hbm_bw"]}, "base": TINY}
    result = fit_measurements(rows, info)
    switch = next(q for q in result.calibration.quality if q.component == "switch")
    assert "to_train at 2 GPUs only" in switch.note
    assert "gpus" not in result.measurements.columns  # the raw table is written back as read
