"""Late binding honours the policy's declared staleness: the cluster never binds an
unpinned trajectory of step s to an engine whose weights are older than s - k
(``ClusterState.may_bind``). Found by a fault sweep (async at staleness 1, 24 GPUs of tp 2,
GPU failures 12 an hour): an engine rejoined rollout with version 1 while the others
synced to 2; trajectories of step 3 resumed after a failure were bound to it and trained
at version 3 on tokens of version 1."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rlsched.cluster.commands import Dispatch, Reassign, SetTimer, SyncWeights, Train
from rlsched.cluster.config import RunConfig
from rlsched.cluster.events import RunStarted, TimerFired, TrajectoryFinished
from rlsched.cluster.faults import Fault, FaultSchedule
from rlsched.cluster.ids import Role
from rlsched.cluster.state import ClusterState
from rlsched.policies import make_policy
from rlsched.sim.presets import default_cost
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload
from rlsched.traces import draw_batches, load_trace, sample_trace_path

from simkit import HAND_COST, FakeScript, trace


def test_may_bind_and_first_bindable_follow_the_step_and_the_bound() -> None:
    st = ClusterState(2, 1, [[("a", "t")], [("b", "t")], [("c", "t")]], 1)
    for tid in ("c", "b", "a"):
        st.enqueue_unbound(tid)
    assert [st.may_bind(t, 0) for t in ("a", "b", "c")] == [True, True, False]
    assert st.first_bindable(0) == "b"  # (c, at the head, needs version 1)
    assert st.first_bindable(1) == "c"
    st.take_unbound("b")
    st.take_unbound("a")
    assert st.first_bindable(0) is None


def test_an_engine_with_old_weights_takes_no_work_of_a_newer_step_until_it_syncs() -> None:
    # (switches take 5 s) engine 0 rolls out A (step 0, 6-16 s) while GPU 1 trains; GPU 2
    # is sent to rollout as A ends, its switch (loading version 0) ending at 21, after the
    # optimizer step made version 1 (18). At 22 B (step 1, staleness 0) is dispatched
    # unbound while engine 0 syncs: neither engine may take it until then; engine 2 (the
    # least loaded, still version 0) never may, so B goes to engine 0 once synced.
    df = trace([("t", "A", 0, 10, 10, 0.0), ("u", "B", 0, 10, 10, 0.0)])
    seen: list = []

    def script(event, view):
        if isinstance(event, RunStarted):
            return [Reassign((0,), Role.ROLLOUT), Reassign((1,), Role.TRAIN), SetTimer(6.0, "a"),
                    SetTimer(22.0, "b"), SetTimer(23.0, "look")]
        if isinstance(event, TimerFired) and event.tag == "a":
            return [Dispatch(("A",), 0)]
        if isinstance(event, TrajectoryFinished) and event.trajectory == "A":
            return [Train(("A",)), Reassign((2,), Role.ROLLOUT)]
        if isinstance(event, TimerFired) and event.tag == "b":
            seen.append({e: view.engine(e).version for e in view.engines()})
            return [SyncWeights((0,)), Dispatch(("B",))]
        if isinstance(event, TimerFired) and event.tag == "look":
            seen.append(view.trajectory("B").engine)
            return [SyncWeights((2,))]
        if isinstance(event, TrajectoryFinished) and event.trajectory == "B":
            return [Train(("B",))]
        return []

    cost = replace(HAND_COST, switch_s=5.0, optimizer_step_s=2.0)
    out = simulate(Workload.from_frame(df), [[("A", "A")], [("B", "B")]], FakeScript(script, staleness=0),
                   RunConfig(gpus=3, tp=1, steps=2, check=True), cost)
    assert out.result.complete
    assert seen == [{0: 0, 2: 0}, 0]


@pytest.mark.parametrize("spec", ["async:staleness=1"])
def test_the_fault_sweep_run_stays_within_its_bound(spec) -> None:
    df = load_trace(sample_trace_path())
    faults = FaultSchedule((Fault("gpu", per_hour=12.0), Fault("tool", per_hour=60.0),
                            Fault("trainer", per_hour=6.0), Fault("sync", per_hour=12.0)), seed=1, recover_s=30.0)
    policy = make_policy(spec)
    out = simulate(Workload.from_frame(df), draw_batches(df, 4, 8), policy,
                   RunConfig(gpus=24, tp=2, steps=4, tasks_per_step=8, check=True, faults=faults), default_cost())
    r = out.result
    assert r.complete
    stale = max(t.trained_version - t.min_version for t in r.state.trajs.values()
                if t.status.value == "trained" and t.min_version >= 0)
    assert stale <= policy.max_staleness
