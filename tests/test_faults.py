"""Fault injection, exact cases: a given fault at a given time gives the hand-computed retry.

The workload (``simkit.HAND_COST``: a decode step is 1 s per token, prefill and weight sync
free, a role switch 1 s) on 2 GPUs, tp=1:

* A: turn 0 generates 10 tokens, then a 2 s tool call; turn 1 generates 10 tokens;
* B: one turn of 3 tokens.

Without faults (colocated): switch to rollout 0-1 s; A on engine 0 decodes 1-11, tool
11-13, decodes 13-23; B on engine 1 is done at 4; switch to training 23-24; train (free):
makespan 24.
"""

from dataclasses import replace

import pytest

from rlsched.analysis.breakdown import breakdown
from rlsched.analysis.metrics import NO_WORK, state_seconds, summarize
from rlsched.cluster.commands import Reassign
from rlsched.cluster.errors import ConfigError, PolicyError
from rlsched.cluster.faults import Fault, FaultSchedule, parse_faults
from rlsched.cluster.ids import Role
from rlsched.cluster.legality import check as legality_check
from rlsched.cluster.record import read_run
from rlsched.cluster.state import ClusterState
from rlsched.config import parse_config

from simkit import HAND_COST, run, trace

SPECS = ["colocated", "async:staleness=0", "elastic", "partial"]


@pytest.fixture
def df():
    return trace([("a", "A", 0, 0, 10, 2.0), ("a", "A", 1, 0, 10, 0.0), ("b", "B", 0, 0, 3, 0.0)])


def gpu_fault(at: float, gpu: int, recover_s: float = 5.0) -> FaultSchedule:
    return FaultSchedule((Fault("gpu", at=at, gpu=gpu),), recover_s=recover_s)


# ---------------------------------------------------------------- GPU failures
@pytest.mark.parametrize(
    ("spec", "makespan"),
    [
        # A loses the 3 tokens of turn 1 it made on engine 0 (13-16), resumes turn 1 on
        # engine 1 at 16 (re-prefill is free) and is done at 26; training switch 26-27.
        ("colocated", 27.0),
        ("partial", 27.0),
        # elastic hands engine 1 to the trainer when B finishes (4-5) and trains B there;
        # the failure then leaves no engine, so GPU 1 switches back (16-17), A resumes
        # turn 1 there at 17 and is done at 27; training switch 27-28.
        ("elastic", 28.0),
        # async (1 rollout engine on GPU 0, trainer on GPU 1): no engine is left, so A
        # waits for GPU 0 to recover at 21, its switch back to rollout ends at 22, and
        # turn 1 runs 22-32.
        ("async:staleness=0", 32.0),
    ],
)
def test_gpu_failure_mid_turn_resumes_from_last_finished_turn(df, tmp_path, spec, makespan):
    out = run(df, [["A", "B"]], spec, out_dir=tmp_path / "r", faults=gpu_fault(16.0, 0))
    res = out.result
    assert res.complete
    assert res.makespan == pytest.approx(makespan, abs=1e-6)
    a = res.state.trajs["A"]
    assert a.status.value == "trained" and a.turns_done == 2 and a.dispatches == 2
    assert res.trajs["A"].wasted == 3  # tokens 13-16 of turn 1, thrown away with engine 0
    assert res.trajs["A"].fault_hits == 1
    assert res.faults["retried_trajectories"] == 1
    assert res.faults["failed_gpu_seconds"] == pytest.approx(5.0)
    rec = read_run(tmp_path / "r")
    kinds = list(rec.events["kind"])
    assert kinds.index("Fault") < kinds.index("WorkerFailed") < kinds.index("WorkerRecovered")
    fin = rec.events[(rec.events["kind"] == "TrajectoryFinished") & (rec.events["trajectory"] == "A")]
    assert list(fin["detail"]) == ["interrupted", "done"]
    assert fin["time"].iloc[0] == pytest.approx(16.0)
    row = summarize(rec)
    assert row["lost_trajectories"] == 0
    assert (row["faults"], row["retried_trajectories"], row["fault_wasted_tokens"]) == (1, 1, 3)
    assert row["failed_gpu_seconds"] == pytest.approx(5.0)
    # the failed GPU is drawn and counted as failed (16-21), not as idle
    secs = state_seconds(rec)
    assert secs["failed"] == pytest.approx(5.0)
    failed = rec.intervals[rec.intervals["state"].astype(str) == "failed"]
    assert list(failed["gpu_first"]) == [0] and list(failed["start"]) == [pytest.approx(16.0)]
    causes = breakdown(rec).set_index("state")
    assert causes.loc["failed", "gpu_seconds"] == pytest.approx(5.0)
    assert row["idle_fraction"] * 2 * res.makespan == pytest.approx(float(secs[list(NO_WORK)].sum()))


def test_gpu_failure_without_faults_is_the_old_run(df):
    base = run(df, [["A", "B"]], "colocated")
    assert base.result.makespan == pytest.approx(24.0, abs=1e-6)
    assert base.result.faults["faults"] == 0


def test_failed_gpu_is_left_out_until_it_recovers(df):
    # GPU 0 fails at 16 and comes back at 60: colocated trains on GPU 1 alone (switch
    # 26-27), so the failed GPU is never in a role; every invariant is checked in the run.
    out = run(df, [["A", "B"]], "colocated", faults=gpu_fault(16.0, 0, 60.0))
    assert out.result.makespan == pytest.approx(27.0, abs=1e-6)
    assert out.result.faults["failed_gpu_seconds"] == pytest.approx(27.0 - 16.0)
    assert out.result.gpu_seconds["failed"] == pytest.approx(27.0 - 16.0)  # failed to the end


def test_gpu_failure_during_a_role_switch(df):
    # At 0.5 GPU 1 is switching to rollout: its switch is cut short, so only engine 0
    # opens (at 1) and takes both A and B; the run completes on the GPUs left.
    out = run(df, [["A", "B"]], "colocated", faults=gpu_fault(0.5, 1, 2.0))
    assert out.result.complete
    # same timeline as without the fault (decode is 1 s/token whatever the batch): GPU 1 is
    # back at 2.5, idle, and joins the switch to training at 23
    assert out.result.makespan == pytest.approx(24.0, abs=1e-6)
    assert out.result.state.trajs["B"].engine == 0
    assert out.result.state.trajs["B"].status.value == "trained"


# --------------------------------------------------------------- trainer failures
def _train_window(out) -> tuple[float, float]:
    """(start, seconds) of the base run's training: its switch ends at start."""
    end = out.result.makespan
    return end - out.result.steps[0]["train_seconds"], out.result.steps[0]["train_seconds"]


@pytest.fixture
def slow_train():
    return replace(HAND_COST, train_mfu=1e-9)  # training takes measurable time


def test_trainer_failure_mid_step_reruns_the_step(df, slow_train):
    base = run(df, [["A", "B"]], "colocated", cost=slow_train)
    start, secs = _train_window(base)
    assert secs > 0
    sched = FaultSchedule((Fault("trainer", at=start + secs / 2),), restart_s=2.0)
    out = run(df, [["A", "B"]], "colocated", cost=slow_train, faults=sched)
    # half the micro-batch is lost, 2 s restart, then the whole step again
    assert out.result.makespan == pytest.approx(base.result.makespan + secs / 2 + 2.0, rel=1e-9)
    assert out.result.faults["train_gpu_seconds_lost"] == pytest.approx(2 * (secs / 2) + 2 * 2.0, rel=1e-9)
    assert out.result.state.version == 1


def test_trainer_gpu_failure_shrinks_the_trainer(df, slow_train):
    base = run(df, [["A", "B"]], "colocated", cost=slow_train)
    start, secs = _train_window(base)
    out = run(df, [["A", "B"]], "colocated", cost=slow_train,
              faults=FaultSchedule((Fault("gpu", at=start + secs / 2, gpu=1),), restart_s=2.0, recover_s=1e6))
    # the step re-runs on 1 GPU: twice as long
    assert out.result.makespan == pytest.approx(base.result.makespan + secs / 2 + 2.0 + secs, rel=1e-9)


def test_trainer_failure_when_not_training_has_no_effect(df):
    out = run(df, [["A", "B"]], "colocated", faults=FaultSchedule((Fault("trainer", at=5.0),)))
    assert out.result.makespan == pytest.approx(24.0, abs=1e-6)
    assert out.result.faults["without_effect"] == 1


# ------------------------------------------------------------------- tool hangs
@pytest.mark.parametrize("spec", SPECS)
def test_hung_tool_call_is_cut_at_the_limit(df, tmp_path, spec):
    base = run(df, [["A", "B"]], spec)
    sched = FaultSchedule((Fault("tool", at=0.0, trajectory="A"),), tool_timeout_s=7.0)
    out = run(df, [["A", "B"]], spec, faults=sched, out_dir=tmp_path / "r")
    # A's only tool call (2 s, 11-13) hangs and is cut at 7 s (11-18): 5 s later
    assert out.result.makespan == pytest.approx(base.result.makespan + 5.0, abs=1e-6)
    assert out.result.faults["tool_seconds_lost"] == pytest.approx(5.0)
    ev = read_run(tmp_path / "r").events
    cut = ev[ev["kind"] == "ToolTimedOut"]
    assert list(cut["trajectory"]) == ["A"] and cut["time"].iloc[0] == pytest.approx(18.0)


# ------------------------------------------------------------------ sync failures
def test_failed_weight_sync_is_retried(df, tmp_path):
    steps = [["A", "B"], ["A2", "B2"]]
    two = trace([(t, f"{x}{s}", k, p, o, e) for s in ("", "2")
                 for (t, x, k, p, o, e) in [("a", "A", 0, 0, 10, 2.0), ("a", "A", 1, 0, 10, 0.0), ("b", "B", 0, 0, 3, 0.0)]])
    base = run(two, steps, "async:staleness=0")
    sched = FaultSchedule((Fault("sync", at=0.0),), sync_retry_s=3.0)
    out = run(two, steps, "async:staleness=0", faults=sched, out_dir=tmp_path / "r")
    # the sync after step 1 fails (it is free), is retried 3 s later; batch 2 waits for it
    assert out.result.makespan == pytest.approx(base.result.makespan + 3.0, abs=1e-6)
    ev = read_run(tmp_path / "r").events
    failed = ev[ev["kind"] == "SyncFailed"]
    synced = ev[ev["kind"] == "WeightsSynced"]
    assert len(failed) == 1 and synced["time"].iloc[0] == pytest.approx(failed["time"].iloc[0] + 3.0)


def test_sync_fault_without_a_sync_is_reported_as_never_hit(df):
    out = run(df, [["A", "B"]], "colocated", faults=FaultSchedule((Fault("sync", at=0.0),)))
    assert out.result.faults["armed_never_hit"] == 1


# ---------------------------------------------------------------- determinism
@pytest.mark.parametrize("spec", SPECS)
def test_rate_faults_are_deterministic_for_a_seed(df, spec):
    sched = FaultSchedule((Fault("gpu", per_hour=120.0), Fault("tool", per_hour=600.0)), seed=3, recover_s=4.0)
    a = run(df, [["A", "B"]], spec, faults=sched)
    b = run(df, [["A", "B"]], spec, faults=sched)
    assert a.result.makespan == b.result.makespan and a.result.faults == b.result.faults
    assert a.result.faults["gpu"] >= 1


@pytest.mark.parametrize("spec", SPECS)
def test_faults_faster_than_any_progress_end_in_one_line(df, spec):
    """GPUs failing every few ms (and recovering after an hour) would simulate forever."""
    sched = FaultSchedule((Fault("gpu", per_hour=1e6),), recover_s=3600.0)
    with pytest.raises(ConfigError, match=r"\[faults\]: 1000 faults fired by t=\d+s without one turn") as err:
        run(df, [["A", "B"]], spec, faults=sched)
    assert "\n" not in str(err.value)
    # (it names the knob of each kind: a trainer fault's is restart_s, not recover_s)
    assert "recover_s (GPU faults) or restart_s (trainer faults)" in str(err.value)


@pytest.mark.parametrize("spec", SPECS)
def test_harmless_faults_during_a_long_tool_call_do_not_end_the_run(spec):
    """A two-hour tool call outlasts the 1,000 faults a rate of 1,000 an hour fires: tool hangs
    it outlasts anyway (cut at 300 s), and sync faults armed while one already is, stop no
    work, so the run is waiting, not outpaced (it used to end with 'the fault rate outpaces
    the cluster')."""
    df = trace([("a", "A", 0, 0, 10, 7200.0), ("a", "A", 1, 0, 10, 0.0), ("b", "B", 0, 0, 3, 0.0)])
    sched = FaultSchedule((Fault("tool", per_hour=1000.0), Fault("sync", per_hour=1000.0)), seed=1)
    out = run(df, [["A", "B"]], spec, faults=sched)
    assert out.result.complete and out.result.faults["faults"] >= 1000
    assert out.result.makespan >= run(df, [["A", "B"]], spec).result.makespan


def test_harmless_faults_at_an_absurd_rate_still_end_in_one_line(monkeypatch):
    """Harmless faults get a larger allowance, but a bounded one: millions an hour during a
    long tool call would take long to simulate (allowance lowered here to keep it quick)."""
    import rlsched.sim.faults as sim_faults

    monkeypatch.setattr(sim_faults, "HARMLESS_WITHOUT_PROGRESS", 5000)
    df = trace([("a", "A", 0, 0, 10, 7200.0), ("b", "B", 0, 0, 3, 0.0)])
    sched = FaultSchedule((Fault("tool", per_hour=1e7),))
    with pytest.raises(ConfigError, match=r"\[faults\]: 5000 faults fired by t=\d+s without one turn") as err:
        run(df, [["A", "B"]], "colocated", faults=sched)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------- legality
def test_failed_gpu_cannot_be_reassigned():
    st = ClusterState(2, 1, [[("t", "task")]], 0)
    st.failed.add(1)
    with pytest.raises(PolicyError, match="GPU 1, which has failed"):
        legality_check(st, Reassign((0, 1), Role.ROLLOUT))
    assert st.failed_gpus() == (1,)


# ---------------------------------------------------------------------- config
def test_faults_table_parses():
    cfg = parse_config({"faults": {"seed": 7, "recover_s": 30, "fault": [
        {"kind": "gpu", "at": 100, "gpu": 3}, {"kind": "gpu", "per_hour": 1.0},
        {"kind": "tool", "at": 5, "trajectory": "T1"}, {"kind": "sync", "at": 0}, {"kind": "trainer", "at": 9.5},
    ]}})
    f = cfg.run.faults
    assert f is not None and f.seed == 7 and f.recover_s == 30 and len(f.faults) == 5
    assert f.faults[0] == Fault("gpu", at=100, gpu=3)
    assert parse_config({}).run.faults is None


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ([], "[faults] must be a table"),
        ({"seeed": 1}, "unknown key 'seeed' (did you mean 'seed'?)"),
        ({"seed": -1}, "seed=-1: expected an integer >= 0"),
        ({"recover_s": 0}, "recover_s=0: expected a finite number > 0"),
        ({"fault": [{"at": 3}]}, "entry 0: needs kind"),
        ({"fault": [{"kind": "disk", "at": 3}]}, "kind='disk': expected one of gpu, trainer, tool, sync"),
        ({"fault": [{"kind": "gpu"}]}, "give exactly one of at (seconds) or per_hour (rate)"),
        ({"fault": [{"kind": "gpu", "at": 1, "per_hour": 2}]}, "give exactly one of at"),
        ({"fault": [{"kind": "gpu", "at": -1}]}, "at=-1: expected a finite number >= 0"),
        ({"fault": [{"kind": "gpu", "per_hour": 0}]}, "per_hour=0: expected a finite number > 0"),
        ({"fault": [{"kind": "tool", "at": 1, "gpu": 2}]}, "gpu= only applies"),
        ({"fault": [{"kind": "gpu", "at": 1, "gpu": "x"}]}, "gpu='x': expected a GPU index"),
        ({"fault": [{"kind": "gpu", "at": 1, "when": 2}]}, "entry 0: unknown key 'when'"),
        ({"fault": "gpu"}, "faults.fault must be [[faults.fault]] entries"),
    ],
)
def test_faults_config_errors_are_one_line(table, message):
    with pytest.raises(ConfigError) as exc:
        parse_faults(table, "c.toml")
    text = str(exc.value)
    assert message in text and text.startswith("c.toml: ") and "\n" not in text


def test_fault_gpu_outside_the_cluster_is_a_config_error(df):
    with pytest.raises(ConfigError, match=r"gpu=9: the cluster has GPUs 0..1"):
        run(df, [["A", "B"]], "colocated", faults=gpu_fault(1.0, 9))


def test_faults_is_not_a_run_key():
    with pytest.raises(ConfigError, match="unknown key 'faults'"):
        parse_config({"run": {"faults": 1}})


def test_faults_table_from_a_config_file(tmp_path):
    from rlsched.config import load_config

    p = tmp_path / "c.toml"
    p.write_text('[run]\nsteps = 2\n\n[faults]\nseed = 3\n\n[[faults.fault]]\nkind = "gpu"\nper_hour = 1.0\n')
    cfg = load_config(p)
    assert cfg.run.steps == 2 and cfg.run.faults == FaultSchedule((Fault("gpu", per_hour=1.0),), seed=3)
    p.write_text('[[faults.fault]]\nkind = "gpu"\nat = "soon"\n')
    with pytest.raises(ConfigError, match=r"c.toml: \[\[faults.fault\]\] entry 0: fault 'gpu': at='soon'"):
        load_config(p)


@pytest.mark.parametrize(("spec", "a_done"), [
    # the final tool call runs on past the failure; A is dispatched again at once, waits
    # for the call (23-28) and is done when it returns
    ("colocated", 28.0),
    # no engine is left: the call returns at 28 while A waits; GPU 0 is back at 30, its
    # switch ends at 31, A is dispatched again and is done at once (nothing left to run)
    ("async:staleness=0", 31.0),
])
def test_gpu_failure_during_the_last_tool_call(spec, a_done):
    # A's last turn (decoded 13-23) is followed by a 5 s tool call; GPU 0 fails at 25
    df = trace([("a", "A", 0, 0, 10, 2.0), ("a", "A", 1, 0, 10, 5.0), ("b", "B", 0, 0, 3, 0.0)])
    out = run(df, [["A", "B"]], spec, faults=gpu_fault(25.0, 0))
    res = out.result
    assert res.complete
    a = res.state.trajs["A"]
    assert a.status.value == "trained" and a.turns_done == 2 and a.dispatches == 2
    assert a.finish_time == pytest.approx(a_done, abs=1e-6)
    assert res.trajs["A"].wasted == 0  # its turns were all done: nothing thrown away



def _failure_storm(t2_outputs: tuple[int, int], t4_output: int):
    """The small trace and fault schedule hypothesis shrank two bugs to: three GPU
    failures at t=0, one every 10 s after, 0.5 s to recover; T2 has four turns behind 17 s
    tool calls, everything else is instant."""
    rows = [("task0", "T0", k, 0, 0, 0.0) for k in range(3)]
    rows += [("task1", "T1", k, 0, 0, 0.0) for k in range(3)]
    rows += [("task2", "T2", 0, 0, 0, 17.0), ("task2", "T2", 1, 0, 0, 17.0),
             ("task2", "T2", 2, 0, t2_outputs[0], 17.0), ("task2", "T2", 3, 0, t2_outputs[1], 17.0),
             ("task0", "T3", 0, 0, 0, 0.0), ("task1", "T4", 0, 0, t4_output, 0.0)]
    sched = FaultSchedule((Fault("gpu", at=0.0), Fault("gpu", at=0.0), Fault("gpu", at=0.0),
                           Fault("gpu", per_hour=360.0)),
                          seed=99, recover_s=0.5, restart_s=0.0, tool_timeout_s=1.0, sync_retry_s=0.0)
    return trace(rows), sched


def test_colocated_trains_when_its_rollout_ends_during_a_failures_reassign():
    """Found by test_faults_properties: the step's last trajectory finished its last tool
    call while every GPU was failed or switching to rollout, so the switch to training found
    no GPU; the GPUs that then arrived in rollout waited there forever (a stall)."""
    df, sched = _failure_storm((9, 27), 1)
    out = run(df, [["T0", "T3"], ["T1", "T4"], ["T2"]], "colocated", gpus=4, tp=1,
              sandbox_slots=1, check=True, faults=sched)
    assert out.result.complete and out.result.state.version == 3


def test_an_engine_opens_only_if_its_partner_switches_to_rollout_too():
    """Found by test_faults_properties (tp=2): GPU 0 failed while it switched to rollout
    with GPU 1, recovered, and was sent to train; when GPU 1's switch ended the driver
    opened engine 0 with GPU 0 switching to train (a GPU in two roles)."""
    df, sched = _failure_storm((21, 24), 0)
    out = run(df, [["T0", "T2", "T4"], ["T1", "T3"]], "colocated", gpus=4, tp=2,
              sandbox_slots=1, check=True, faults=sched)
    assert out.result.complete and out.result.state.version == 2
