"""ClusterState's O(1) rollout sums (RolloutTally) agree with a scan of the engines."""

from __future__ import annotations

import pytest

from rlsched.cluster.errors import InvariantViolation
from rlsched.cluster.ids import TrajStatus
from rlsched.cluster.state import ClusterState, EngineState
from rlsched.cluster.view import RolloutTotals


@pytest.fixture
def st() -> ClusterState:
    s = ClusterState(8, 2, [[(f"t{i}", "task") for i in range(6)]], max_staleness=0)
    for e in (2, 0, 1):
        s.add_engine(EngineState(e, s.engine_gpus(e), 0, 1000))
    return s


def test_engine_methods_keep_the_totals(st):
    e0, e1 = st.engines_[0], st.engines_[1]
    e0.enqueue("t0")
    e0.enqueue("t1")
    e0.enqueue("t2", front=True)
    assert st.rollout_totals() == RolloutTotals(3, 3, 1, 0)
    assert e0.dequeue(admit=True) == "t2"
    e0.set_kv(300)
    assert e0.dequeue(admit=False) == "t0"  # (left without running: e.g. too long)
    assert st.rollout_totals() == RolloutTotals(3, 2, 1, 300)
    e0.discard("t1")  # from the queue: the queue is empty now
    e0.discard("t9")  # not here: nothing changes
    e1.enqueue("t3")
    e1.dequeue(admit=True)
    e1.set_kv(50)
    e1.enqueue("t4", front=True)  # (waits for KV at the head)
    assert st.rollout_totals() == RolloutTotals(3, 3, 1, 350)
    st.check_totals()
    e1.drain()  # a draining engine no longer counts, whatever it still holds
    assert st.rollout_totals() == RolloutTotals(2, 1, 0, 300)
    e1.discard("t3")
    e1.set_kv(0)
    assert st.rollout_totals() == RolloutTotals(2, 1, 0, 300)
    st.check_totals()
    st.remove_engine(1)
    st.remove_engine(0)
    assert st.rollout_totals() == RolloutTotals(1, 0, 0, 0)
    st.check_totals()


def test_engine_ids_are_cached_until_an_engine_comes_drains_or_goes(st):
    ids = st.engines()
    assert ids == (0, 1, 2) and st.engines() is ids
    st.engines_[1].drain()
    assert st.engines() == (0, 2)
    st.add_engine(EngineState(3, st.engine_gpus(3), 0, 1000))
    assert st.engines() == (0, 2, 3)
    st.remove_engine(1)
    assert st.engines() == (0, 2, 3)
    st.remove_engine(0)
    assert st.engines() == (2, 3)
    st.check_totals()


def test_an_engine_changed_behind_the_tally_is_caught(st):
    st.engines_[0].running.add("t0")  # (not through its methods)
    with pytest.raises(InvariantViolation, match=r"engine 0 has load 0 but 1 running \+ 0 queued"):
        st.check_totals()
    st.engines_[0].running.clear()
    st.engines_[1].kv_used = 7  # (not through set_kv)
    with pytest.raises(InvariantViolation, match=r"rollout tally .* \(3, 0, 0, 0\) != scan \(3, 0, 0, 7\)"):
        st.check_totals()


def test_an_engine_is_added_once(st):
    with pytest.raises(ValueError, match="engine 0 is already a rollout engine"):
        st.add_engine(EngineState(0, st.engine_gpus(0), 0, 1000))
    other = ClusterState(8, 2, [], max_staleness=0)
    with pytest.raises(ValueError, match="engine 1 belongs to another cluster state"):
        other.add_engine(st.engines_[1])


def test_interrupted_is_the_interrupted_part_of_finished(st):
    for tid, status in [("t0", TrajStatus.INTERRUPTED), ("t1", TrajStatus.DONE),
                        ("t2", TrajStatus.INTERRUPTED), ("t3", TrajStatus.INTERRUPTED)]:
        st.mark_active(tid, TrajStatus.RUNNING, 0)
        st.mark_finished(tid, status)
    assert st.finished(0) == ("t0", "t1", "t2", "t3")
    assert st.interrupted(0) == ("t0", "t2", "t3")
    st.mark_resumable("t0")  # dispatched again: neither finished nor interrupted
    st.trajs["t2"].in_micro_batch = True  # (trained as partial: in a queued micro-batch)
    assert st.interrupted(0) == ("t3",) and st.finished(0) == ("t1", "t3")
    st.mark_trained(["t2"], 0)
    st.mark_dropped(["t3"])
    st.mark_active("t0", TrajStatus.RUNNING, 0)
    st.mark_finished("t0", TrajStatus.INTERRUPTED)  # interrupted again: last in finish order
    assert st.interrupted(0) == ("t0",) and st.finished(0) == ("t1", "t0")
    assert st.interrupted(1) == () and st.interrupted(-1) == ()


def test_engine_loads_are_the_active_engines_running_plus_queued(st):
    st.engines_[0].enqueue("t0")
    st.engines_[0].dequeue(admit=True)
    st.engines_[0].enqueue("t1")
    st.engines_[2].enqueue("t2")
    assert st.engine_loads() == ((0, 2), (1, 0), (2, 1))
    assert st.engine_loads() == tuple((e, st.engine(e).load) for e in st.engines())
    st.engines_[0].drain()
    assert st.engine_loads() == ((1, 0), (2, 1))


def test_engine_loads_are_kept_until_a_load_or_the_engines_change(st):
    def fresh():
        return tuple((e, st.engines_[e].load) for e in st.engines())

    loads = st.engine_loads()
    assert loads == ((0, 0), (1, 0), (2, 0)) and st.engine_loads() is loads
    e0, e1 = st.engines_[0], st.engines_[1]
    # (change, whether the loads are kept: no active engine's load nor the set changed)
    steps = [(lambda: e0.enqueue("t0"), False), (lambda: e0.dequeue(admit=True), True),
             (lambda: e0.admit("t1"), False), (lambda: e0.enqueue("t2", front=True), False),
             (lambda: e0.dequeue(admit=False), False), (lambda: e0.discard("t1"), False),
             (lambda: e0.discard("t9"), True), (lambda: e0.set_kv(5), True),
             (lambda: e1.enqueue("t3"), False), (lambda: e1.drain(), False),
             (lambda: e1.discard("t3"), True),  # (a draining engine is not listed)
             (lambda: st.add_engine(EngineState(3, st.engine_gpus(3), 0, 1000)), False),
             (lambda: st.remove_engine(1), True), (lambda: st.remove_engine(2), False)]
    for change, kept in steps:
        before = st.engine_loads()
        change()
        assert st.engine_loads() == fresh()
        assert (st.engine_loads() is before) == kept
        st.check_totals()
    assert st.engine_loads() == ((0, 1), (3, 0))


def test_loads_kept_after_an_engine_changed_behind_the_tally_are_caught(st):
    st.engines_[0].enqueue("t0")
    assert st.engine_loads() == ((0, 1), (1, 0), (2, 0))
    e0, e2 = st.engines_[0], st.engines_[2]  # t0 moves from 0 to 2, not through their methods
    e0.queue.clear()
    e0.load -= 1
    e2.queue.append("t0")
    e2.load += 1
    with pytest.raises(InvariantViolation, match=r"engine loads \(\(0, 1\), \(1, 0\), \(2, 0\)\) / \[\(0, 1\), \(1, 0\), \(2, 0\)\] kept"):
        st.check_totals()


def test_role_list_assign_keeps_the_gpus_of_each_role(st):
    from rlsched.cluster.ids import Role

    st.roles.assign((0, 1, 2, 3), Role.ROLLOUT)
    st.roles[5] = Role.TRAIN
    st.roles.assign((3, 5, 6), Role.SWITCHING)
    assert st.gpus_in(Role.ROLLOUT) == (0, 1, 2)
    assert st.gpus_in(Role.SWITCHING) == (3, 5, 6)
    assert st.gpus_in(Role.TRAIN) == ()
    assert st.gpus_in(Role.IDLE) == (4, 7)
    assert [st.role(g) for g in range(8)] == [Role.ROLLOUT] * 3 + [Role.SWITCHING, Role.IDLE] + [Role.SWITCHING] * 2 + [Role.IDLE]


def test_role_list_keeps_each_roles_gpus_ascending_through_random_switches():
    import random

    from rlsched.cluster.ids import Role

    rng = random.Random(0)
    s = ClusterState(64, 4, [], max_staleness=0)
    roles = list(Role)
    for _ in range(500):
        gpus = rng.sample(range(64), rng.randint(1, 8))
        s.set_roles(gpus, rng.choice(roles))
        r = rng.choice(roles)
        assert s.gpus_in(r) == tuple(g for g in range(64) if s.role(g) is r)
