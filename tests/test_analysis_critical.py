"""The critical-path view of a run (rlsched.analysis.critical) on records the simulator wrote:
by hand on the hand-costed timeline, and its invariants on a long-tailed run."""

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from rlsched.analysis.critical import CRITICAL_COLUMNS, critical_path, critical_totals
from rlsched.analysis.load import load_run
from rlsched.analysis.metrics import summarize
from rlsched.analysis.narrative import held_back
from rlsched.analysis.plots import plot_held_back
from rlsched.analysis.report import write_report
from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import RecordError
from rlsched.policies import make_policy
from rlsched.sim.bound import turn_solo_seconds
from rlsched.sim.presets import default_cost
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload
from rlsched.traces import draw_batches, generate_trace

from simkit import ABC, APPROX, HAND_COST, run


def solo_of(workload: Workload, cost, tp: int) -> dict[str, float]:
    _, solo = turn_solo_seconds(workload, cost, tp)
    cs = np.concatenate([[0.0], np.cumsum(solo)])
    return {tid: float(cs[workload.start[i] + workload.turns[i]] - cs[workload.start[i]])
            for tid, i in workload.index.items()}


def test_turn_solo_seconds_by_hand():
    # decode 1 s per token, prefill ~0: A 3 tokens, B 1 + 2 s of tool + 1, C 2 tokens
    solo = solo_of(Workload.from_frame(ABC), HAND_COST, 1)
    assert [solo[t] for t in "ABC"] == pytest.approx([3.0, 4.0, 2.0], abs=1e-6)


def test_colocated_step_by_hand(tmp_path):
    # t=0-1 both GPUs switch to rollout; B (solo 4 s) ends last at 5 on its own engine, as fast
    # as alone; 5-6 the switch to the trainer, training ~0: the step ends at 6
    run(ABC, [["A", "B", "C"]], "colocated", out_dir=tmp_path / "r")
    table = critical_path(load_run(tmp_path / "r"))
    assert tuple(table.columns) == CRITICAL_COLUMNS
    (row,) = table.to_dict("records")
    assert row["last_trajectory"] == "B"
    assert [row[c] for c in ("start_delay_s", "longest_solo_s", "tail_slowdown_s", "after_rollout_s",
                             "period_s")] == pytest.approx([1.0, 4.0, 0.0, 1.0, 6.0], **APPROX)


def test_each_step_waits_for_the_switches_by_hand(tmp_path):
    run(ABC, [["A"], ["C"]], "colocated", out_dir=tmp_path / "r")
    table = critical_path(load_run(tmp_path / "r"))
    assert table["step"].tolist() == [0, 1]
    # step 0: switch 0-1, A 1-4, switch to train 4-5; step 1: switch back 5-6, C 6-8, 8-9
    assert table["start_delay_s"].tolist() == pytest.approx([1.0, 1.0], **APPROX)
    assert table["longest_solo_s"].tolist() == pytest.approx([3.0, 2.0], **APPROX)
    assert table["tail_slowdown_s"].tolist() == pytest.approx([0.0, 0.0], abs=1e-6)
    assert table["after_rollout_s"].tolist() == pytest.approx([1.0, 1.0], **APPROX)
    assert table["period_s"].tolist() == pytest.approx([5.0, 4.0], **APPROX)


def test_the_record_carries_each_trajectorys_solo_seconds(tmp_path):
    run(ABC, [["A", "B", "C"]], "colocated", out_dir=tmp_path / "r")
    rec = load_run(tmp_path / "r")
    t = rec.trajectories.set_index("trajectory")
    assert t.loc[["A", "B", "C"], "solo_seconds"].tolist() == pytest.approx([3.0, 4.0, 2.0], abs=1e-6)
    # the view reads them from the record by default
    (row,) = critical_path(rec).to_dict("records")
    assert (row["longest_solo_s"], row["tail_slowdown_s"]) == pytest.approx((4.0, 0.0), abs=1e-6)


def test_without_solo_times_the_rollout_is_given_whole(tmp_path):
    run(ABC, [["A", "B", "C"]], "colocated", out_dir=tmp_path / "r")
    rec = load_run(tmp_path / "r")
    # a record without the column (a live run's): the solo parts are unknown, not 0
    rec = dataclasses.replace(rec, trajectories=rec.trajectories.drop(columns="solo_seconds"))
    (row,) = critical_path(rec).to_dict("records")
    assert row["rollout_s"] == pytest.approx(4.0, **APPROX)
    assert math.isnan(row["longest_solo_s"]) and math.isnan(row["tail_slowdown_s"])
    cols = summarize(rec)
    assert cols["steps_start_delay_s"] == pytest.approx(1.0, **APPROX)
    assert math.isnan(cols["steps_longest_solo_s"]) and math.isnan(cols["steps_tail_slowdown_s"])


def test_the_report_and_summary_show_it(tmp_path):
    run(ABC, [["A"], ["C"]], "colocated", out_dir=tmp_path / "r")
    row = summarize(load_run(tmp_path / "r"))
    # two steps: switches 1 + 1 s, solos 3 + 2 s, nothing slower, 1 + 1 s after
    assert [row[c] for c in ("steps_start_delay_s", "steps_longest_solo_s", "steps_tail_slowdown_s",
                             "steps_after_rollout_s")] == pytest.approx([2.0, 5.0, 0.0, 2.0], abs=1e-6)
    assert sum(row[c] for c in ("steps_start_delay_s", "steps_longest_solo_s", "steps_tail_slowdown_s",
                                "steps_after_rollout_s")) == pytest.approx(row["sim_seconds"], **APPROX)
    page = write_report([tmp_path / "r"], tmp_path / "rep")
    assert "What holds each step back" in page.read_text()
    assert 'alt="what held the steps back, per policy"' in page.read_text()
    csv = pd.read_csv(tmp_path / "rep" / "critical_path.csv")
    assert csv["step"].tolist() == [0, 1] and set(csv["policy"]) == {"colocated"}


@pytest.fixture(scope="module")
def longtail():
    df = generate_trace("longtail-small", seed=3, tasks=12, samples=4)
    w = Workload.from_frame(df)
    return w, draw_batches(df, 3, 4), solo_of(w, default_cost(), 4)


@pytest.mark.parametrize("spec", ["colocated", "elastic", "elastic:staleness=1", "async:staleness=1"])
def test_parts_and_solo_bound_on_a_long_tailed_run(tmp_path, longtail, spec):
    w, batches, solo = longtail
    out = simulate(w, batches, make_policy(spec), RunConfig(gpus=16, tp=4, steps=3), default_cost(),
                   out_dir=tmp_path / "r")
    rec = load_run(tmp_path / "r")
    table = critical_path(rec)
    assert table["step"].tolist() == [0, 1, 2]
    # the record's solo times: the bound's, over the whole trajectories (none was cut here)
    t = rec.trajectories
    by_run = {rid: solo[tid] for b in batches for rid, tid in b}
    done = (t["finish_status"] == "done").to_numpy()
    assert t["solo_seconds"].to_numpy()[done] == pytest.approx(np.array([by_run[r] for r in t["trajectory"]])[done])
    # solo is a lower bound on every trajectory's rollout: no span is shorter
    spans = t["finish_time"] - t["dispatch_time"]
    assert (spans.to_numpy() >= t["solo_seconds"].to_numpy() - 1e-6).all()
    assert (table["tail_slowdown_s"] >= 0).all() and (table["after_rollout_s"] >= 0).all()
    parts = table[["start_delay_s", "longest_solo_s", "tail_slowdown_s", "after_rollout_s"]].sum(axis=1)
    tot = critical_totals(table)
    assert tot["period_s"] == pytest.approx(out.result.makespan, **APPROX)
    # the parts are each step's link: from the end of step s-k-1 (its weights) to its own end
    assert parts.tolist() == pytest.approx(table["link_s"].tolist(), **APPROX)
    k = make_policy(spec).max_staleness
    ends = rec.steps.set_index("version")["time"]
    assert table["weights_at"].tolist() == pytest.approx(
        [float(ends[s - k]) if s - k >= 1 else 0.0 for s in range(3)], **APPROX)
    if k == 0:  # on-policy: the link is the step, end to end, and the links are the run
        assert table["link_s"].tolist() == pytest.approx(table["period_s"].tolist(), **APPROX)
    else:  # with staleness a link spans k+1 steps: the first k+1 from the run's start
        assert (table["link_s"] >= table["period_s"] - 1e-6).all()
        assert table["link_s"][1] == pytest.approx(table["end"][1], **APPROX)


def test_the_story_names_what_held_the_steps_back():
    row = {"steps_tail_slowdown_s": 300.0, "steps_after_rollout_s": 60.0, "steps_start_delay_s": 40.0,
           "max_staleness": 0}
    assert held_back(row) == ("; its steps took 6.67 min beyond their longest trajectories alone: 75% the "
                               "tail running slower than alone, 15% training after the rollout and 10% waiting to start")
    assert "(with staleness 1 each step's link spans 2 steps)" in held_back({**row, "max_staleness": 1})
    assert held_back({**row, "steps_tail_slowdown_s": math.nan}) == ""  # a live run: no solo times


def test_the_plot_leaves_out_runs_without_solo_times():
    summary = pd.DataFrame({
        "policy": ["sim", "live"], "steps_start_delay_s": [10.0, 5.0], "steps_tail_slowdown_s": [30.0, math.nan],
        "steps_after_rollout_s": [20.0, 1.0]})
    ax = plot_held_back(summary)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["sim"]
    assert sum(p.get_width() for p in ax.patches) == pytest.approx(60.0)  # the three parts, in s


def test_a_record_without_its_times_is_refused_in_one_line(tmp_path):
    run(ABC, [["A", "B", "C"]], "colocated", out_dir=tmp_path / "r")
    f = tmp_path / "r" / "trajectories.parquet"
    pd.read_parquet(f).drop(columns="dispatch_time").to_parquet(f)
    with pytest.raises(RecordError, match=r"trajectories.parquet.*dispatch_time"):
        summarize(load_run(tmp_path / "r"))
