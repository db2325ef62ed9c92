"""Length prediction and late placement, without a driver."""


from rlsched.cluster.commands import Dispatch
from rlsched.cluster.state import ClusterState, EngineState
from rlsched.policies.placement import LateQueue, per_engine_cap
from rlsched.policies.predict import LengthPredictor, OracleLengths, conditional_remaining


def test_prediction_uses_the_groups_finished_siblings():
    p = LengthPredictor()
    for n in (10, 12, 14):
        p.observe("short", n)
    for n in (90, 110):
        p.observe("long", n)
    assert p.remaining("x", "long", 0) == 100
    assert p.remaining("y", "short", 0) == 12
    assert p.remaining("y", "short", 0) < p.remaining("x", "long", 0)


def test_prediction_is_conditional_on_own_progress():
    p = LengthPredictor()
    for n in (10, 20, 100):
        p.observe("t", n)
    assert p.remaining("a", "t", 0) == (10 + 20 + 100) / 3
    assert p.remaining("a", "t", 15) == (20 + 100) / 2 - 15  # longer than 15: 20 or 100
    assert p.remaining("a", "t", 50) == 50  # only 100 is above 50
    # longer than every sibling: it keeps running about as long again as it has
    assert p.remaining("a", "t", 150) == 150


def test_without_any_finished_length_every_trajectory_is_alike():
    p = LengthPredictor()
    assert p.remaining("a", "t", 0) == p.remaining("b", "u", 0) == 1.0
    p.observe("other", 40)  # no sibling yet: every task's lengths are the prior
    assert p.remaining("a", "t", 0) == 40
    assert conditional_remaining([], 7) == 7


def test_oracle_knows_and_is_named_so():
    o = OracleLengths({"a": 30})
    assert o.remaining("a", "t", 10) == 20
    assert o.remaining("missing", "t", 0) == 1.0


def _cluster(engines: int, loads: list[int], n: int):
    batches = [[(f"T{i}", f"task{i}") for i in range(n)]]
    st = ClusterState(engines, 1, batches, max_staleness=0)
    for e in range(engines):
        st.add_engine(EngineState(e, (e,), 0, 1000))
        for k in range(loads[e]):
            st.engines_[e].enqueue(f"busy{e}-{k}")
    return st


def test_place_puts_the_longest_predicted_first_on_the_least_loaded_engine():
    st = _cluster(2, [1, 0], 3)
    q = LateQueue()
    q.add(0, ("T0", "T1", "T2"))
    longest = {"T0": 1.0, "T1": 9.0, "T2": 5.0}
    cmds = q.place(st, cap=2, min_version=lambda s: s, predict=lambda t, task, d: longest[t])
    got = {c.engine: c.trajectories for c in cmds if isinstance(c, Dispatch)}
    # engine 1 (load 0) takes the longest, then the loads tie at 1: engine 0 (lower id) the next
    assert got == {1: ("T1", "T0"), 0: ("T2",)}
    assert not q


def test_place_respects_the_cap_and_keeps_the_rest_queued():
    st = _cluster(2, [0, 0], 5)
    q = LateQueue()
    q.add(0, tuple(f"T{i}" for i in range(5)))
    cmds = q.place(st, cap=2, min_version=lambda s: s, predict=None)
    assert sum(len(c.trajectories) for c in cmds) == 4
    assert len(q) == 1 and q.pending(0) == 1


def test_place_waits_for_engines_with_new_enough_weights():
    st = _cluster(2, [0, 0], 2)
    q = LateQueue()
    q.add(0, ("T0", "T1"))
    assert q.place(st, cap=4, min_version=lambda s: 1, predict=None) == []  # engines hold v0
    assert len(q) == 2


def test_cap_is_an_even_spread_times_pack():
    assert per_engine_cap(128, 16, 1.0) == 8
    assert per_engine_cap(128, 16, 2.0) == 16
    assert per_engine_cap(3, 16, 1.0) == 1


def test_plan_and_compare_agree_on_the_staleness_of_a_cut_run():
    """partial:mode=train with a tiny budget trains trajectories cut before their first
    turn finished (no token of any version). compare counted them as staleness 0; the
    planner read the simulator's per-step figure, which counted version -1 (4 at step 3).
    Now all three -- the per-step figure in the run record too -- say 0."""
    from rlsched.cluster.config import RunConfig
    from rlsched.cluster.ids import TrajStatus
    from rlsched.plan.evaluation import trained_staleness
    from rlsched.policies import make_policy
    from rlsched.sim.cost import CostModel
    from rlsched.sim.run import simulate
    from rlsched.sim.workload import Workload
    from rlsched.traces import draw_batches, load_trace, sample_trace_path

    df = load_trace(str(sample_trace_path()))
    spec = "partial:mode=train,budget_s=5,finish_fraction=0.05"
    out = simulate(Workload.from_frame(df), draw_batches(df, 4, None), make_policy(spec),
                   RunConfig(gpus=64, tp=4, steps=4), CostModel())
    st = out.result.state
    assert any(t.status is TrajStatus.TRAINED and t.min_version < 0 for t in st.trajs.values())
    assert max(s["max_staleness"] for s in out.result.steps) == 0  # (was 4: version -1 counted)
    assert trained_staleness(st) == 0 == make_policy(spec).max_staleness


def test_length_tally_answers_as_the_scan_does() -> None:
    import random

    from rlsched.policies.predict import LengthTally

    rng = random.Random(5)
    tally, seen = LengthTally(), []
    for _ in range(300):
        n = rng.choice([0, 1, 3, 17, 64, 65, 200, rng.randrange(0, 1500)])
        tally.add(n)
        seen.append(n)
        for d in (0, 1, 5, 63, 64, 150, 999, 2000, rng.randrange(0, 1600)):
            assert tally.remaining(d) == conditional_remaining(seen, d)
    assert LengthTally().remaining(7) == conditional_remaining([], 7)


def test_a_trajectory_at_the_one_length_every_sibling_ended_at_is_at_its_end():
    """``remaining`` cannot tell "as long as every finished one" from "longer than all of
    them" (both: as many turns again); ``at_end`` tells the first, with no spread at all."""
    p = LengthPredictor()
    assert not p.at_end("t", 6)  # nothing finished: nothing known
    for task in ("a", "b", "c"):
        p.observe(task, 6)
    assert p.at_end("t", 6) and p.at_end("a", 6)
    assert not p.at_end("t", 5) and not p.at_end("t", 7)
    p.observe("d", 9)  # a spread anywhere in the run: a trajectory at 6 may go on
    assert not p.at_end("t", 6) and not p.at_end("a", 6)
    q = LengthPredictor()
    q.observe("a", 4)
    q.observe("a", 4)
    q.observe("b", 7)  # two siblings alike by chance, in a run with a spread: not the end
    assert not q.at_end("a", 4)
    assert not OracleLengths({"x": 4}).at_end("t", 4)  # the reference's moves are unchanged
