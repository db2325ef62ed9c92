"""The step promise, enforced at the command (``legality.check`` in the one driver loop):
a policy that does not declare ``defers`` trains step s's batch at version s -- what the
lower bound's step chain is proved on (``sim/bound.py``). A ``Train`` or
``TrainMicroBatch`` off its step is refused in one line, before it is recorded or applied;
a deferring policy may train a trajectory in a later step. An ``OptimizerStep`` with nothing
trained since the last one is legal (a policy that dropped a whole step moves on), and the
bound's work term charges a gradient reduction per version that trained something.

The simulator runs these through the same :class:`~rlsched.cluster.loop.DriverLoop` the live
driver does; ``tests/test_driver_loop.py`` checks the loop itself above a fake backend.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from rlsched.cluster.commands import (
    Dispatch,
    Drop,
    Interrupt,
    OptimizerStep,
    Reassign,
    SyncWeights,
    Train,
    TrainMicroBatch,
)
from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import InvariantViolation, PolicyError
from rlsched.cluster.events import (
    RolesChanged,
    RunStarted,
    TrainStepFinished,
    TrajectoryFinished,
    WeightsSynced,
)
from rlsched.cluster.ids import Role, TrajStatus
from rlsched.cluster.legality import check
from rlsched.cluster.state import ClusterState
from rlsched.sim.bound import bound_terms, min_reduce_s
from rlsched.sim.memory import train_layout
from rlsched.sim.presets import default_cost
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload

from simkit import HAND_COST, FakeScript, trace

COST = replace(HAND_COST, optimizer_step_s=1.5, sync_latency_s=0.5)
ROWS = [("t", "A", 0, 10, 6, 0.0), ("t", "B", 0, 10, 4, 0.0)]


def _run(rows, steps, policy, gpus=3):
    w = Workload.from_frame(trace(rows))
    batches = [[(t, t) for t in s] for s in steps]
    out = simulate(w, batches, policy, RunConfig(gpus=gpus, tp=1, steps=len(steps), check=True), COST,
                   spec=policy.name)
    return w, batches, out


def _both_at_once(event, view):
    """A (step 0) and B (step 1) roll out at once; B, which finishes first, is trained at
    version 0 with A, then an empty optimizer step ends step 1."""
    if isinstance(event, RunStarted):
        return [Reassign((0,), Role.ROLLOUT), Reassign((1,), Role.ROLLOUT), Reassign((2,), Role.TRAIN)]
    if isinstance(event, RolesChanged) and event.gpus in ((0,), (1,)):
        return [Dispatch(("A",) if event.gpus == (0,) else ("B",), event.gpus[0])]
    if isinstance(event, TrajectoryFinished) and event.trajectory == "B":
        return [TrainMicroBatch(("B",))]
    if isinstance(event, TrajectoryFinished) and event.trajectory == "A":
        return [Train(("A",)), OptimizerStep()]
    return []


def _step_by_step(a_finished):
    """One engine (GPU 0) and a trainer (GPU 1): step 0's A rolls out, ``a_finished(event)``
    answers its end; once version 1 is synced, step 1's B rolls out and is trained."""
    def script(event, view):
        if isinstance(event, RunStarted):
            return [Reassign((0,), Role.ROLLOUT), Reassign((1,), Role.TRAIN)]
        if isinstance(event, RolesChanged) and event.gpus == (0,):
            return [Dispatch(("A",), 0)]
        if isinstance(event, TrajectoryFinished) and event.trajectory == "A":
            return a_finished(event)
        if isinstance(event, TrainStepFinished) and event.version == 1:
            return [SyncWeights((0,))]
        if isinstance(event, WeightsSynced) and event.version == 1:
            return [Dispatch(("B",), 0)]
        if isinstance(event, TrajectoryFinished) and event.trajectory == "B":
            return [Train(("B",))]
        return []

    return script


def test_training_a_later_step_early_is_refused_in_one_line():
    with pytest.raises(PolicyError) as err:
        _run(ROWS, [["A"], ["B"]], FakeScript(_both_at_once))
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("training 'B' of step 1 at version 0: a policy that does not defer")


def test_a_deferring_policy_may_train_off_its_step_and_the_bound_holds():
    # the same schedule, declared: legal, and the whole-run bound (not the step chain,
    # which lies above it) is what the run gets
    w, b, out = _run(ROWS, [["A"], ["B"]], FakeScript(_both_at_once, defers=True))
    st = out.result.state.trajs
    assert out.result.complete
    assert (st["A"].trained_version, st["B"].trained_version) == (0, 0)
    assert out.result.steps[1]["trajectories"] == 0  # the empty optimizer step's row
    t = out.result.makespan
    assert out.lower_bound_seconds <= t
    promised = bound_terms(w, b, COST, RunConfig(gpus=3, tp=1, steps=2), 0, False,
                           turns_kept={"A": 1, "B": 1})  # (no trained_at: the promise taken)
    assert max(promised.values()) > t + 4.0
    # trained_at off the promised step (a record made elsewhere): the whole-run bound
    kept, at = {"A": 1, "B": 1}, {"A": 0, "B": 0}
    cfg = RunConfig(gpus=3, tp=1, steps=2)
    assert bound_terms(w, b, COST, cfg, 0, False, turns_kept=kept, trained_at=at) == \
        bound_terms(w, b, COST, cfg, 0, True, turns_kept=kept, trained_at=at)


def test_training_an_earlier_step_late_is_refused():
    # an empty optimizer step first, then step 0's A at version 1
    def script(event, view):
        if isinstance(event, RunStarted):
            return [Reassign((0,), Role.ROLLOUT), Reassign((1,), Role.TRAIN), OptimizerStep()]
        if isinstance(event, RolesChanged) and event.gpus == (0,):
            return [Dispatch(("A",), 0)]
        if isinstance(event, TrajectoryFinished):
            return [Train((event.trajectory,))]
        return []

    with pytest.raises(PolicyError, match=r"^training 'A' of step 0 at version 1: a policy that does not defer"):
        _run(ROWS, [["A"], ["B"]], FakeScript(script, staleness=1), gpus=2)


def test_an_empty_optimizer_step_is_legal_when_a_whole_step_was_dropped():
    # On-policy, not deferring: step 0's only trajectory A is interrupted and dropped; an
    # empty optimizer step moves to version 1, where step 1's B is trained. The run ends,
    # and the bound (whose chain charges a step with nothing to train its optimizer step)
    # holds.
    def a_finished(event):
        assert event.status is TrajStatus.INTERRUPTED
        return [Drop(("A",)), OptimizerStep()]

    script = _step_by_step(a_finished)

    def interrupting(event, view):
        cmds = script(event, view)
        if isinstance(event, RolesChanged) and event.gpus == (0,):
            cmds.append(Interrupt(("A",)))
        return cmds

    _, _, out = _run(ROWS, [["A"], ["B"]], FakeScript(interrupting), gpus=2)
    r = out.result
    assert r.complete
    assert r.state.trajs["A"].status is TrajStatus.DROPPED
    assert r.state.trajs["B"].trained_version == 1
    assert [s["trajectories"] for s in r.steps] == [0, 1]
    assert out.lower_bound_seconds <= r.makespan


def test_the_work_term_charges_a_reduction_per_version_that_trained():
    # Deferring, with empty optimizer steps allowed: both steps' trajectories may be trained
    # in one micro-batch at one version -- one gradient reduction, not one per step. The
    # work term charged one per step before (above such a schedule by one reduction).
    cost = default_cost()  # (a trainer floor of 8 GPUs: a reduction costs time at any width)
    w = Workload.from_frame(trace(ROWS))
    b = [[("A", "A")], [("B", "B")]]
    cfg = RunConfig(gpus=16, tp=2, steps=2)
    kept = {"A": 1, "B": 1}
    one = bound_terms(w, b, cost, cfg, 1, True, turns_kept=kept, trained_at={"A": 1, "B": 1})
    two = bound_terms(w, b, cost, cfg, 1, True, turns_kept=kept, trained_at={"A": 0, "B": 1})
    layout = train_layout(cost)
    reduce = min_reduce_s(cost, layout, layout.usable(16))
    assert reduce > 0 and layout.min_gpus == 8
    assert two["work"] - one["work"] == pytest.approx(reduce * 8 / 16, rel=1e-9)
    # without trained_at: one per step for a policy that keeps the promise, one for a deferring one
    assert bound_terms(w, b, cost, cfg, 1, False, turns_kept=kept)["work"] == pytest.approx(two["work"])
    assert bound_terms(w, b, cost, cfg, 1, True, turns_kept=kept)["work"] == pytest.approx(one["work"])


def test_check_takes_the_promise_from_its_caller():
    # legality.check itself: a Train of a step-1 trajectory at version 0 is refused unless
    # the caller says the policy defers
    st = ClusterState(2, 1, [[("a", "t")], [("b", "t")]], 1)
    st.mark_finished("b", TrajStatus.DONE)
    st.trajs["b"].min_version = 0
    with pytest.raises(PolicyError, match=r"^training 'b' of step 1 at version 0"):
        check(st, Train(("b",)))
    check(st, Train(("b",)), defers=True)
    check(st, OptimizerStep())  # (empty: legal)


def test_the_run_check_re_reads_the_promise_from_the_trained_versions():
    # --check re-checks, on the result, the version each trajectory was trained at (what the
    # bound reads): a record saying step 1's B was trained at version 0 is refused
    from rlsched.sim.driver import SimDriver
    from rlsched.sim.invariants import check_result

    script = _step_by_step(lambda event: [Train(("A",))])

    w = Workload.from_frame(trace(ROWS))
    driver = SimDriver(w, [[("A", "A")], [("B", "B")]], FakeScript(script), RunConfig(gpus=2, tp=1, steps=2),
                       COST)
    result = driver.run()
    check_result(result, driver)  # as run: kept
    result.state.trajs["B"].trained_version = 0
    with pytest.raises(InvariantViolation, match="B: of step 1, trained at version 0 by a policy that does not defer"):
        check_result(result, driver)
    driver.loop.defers = True  # (a deferring policy may)
    check_result(result, driver)
