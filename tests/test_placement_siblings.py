"""``LateQueue.place`` spreads a task's samples over engines (no driver, a real
ClusterState): siblings have correlated lengths, so an engine that takes a whole group
holds the long task's samples together and is the step's tail."""

from test_policy_elastic import _apply_dispatch

from rlsched.cluster.commands import Dispatch
from rlsched.cluster.state import ClusterState, EngineState
from rlsched.policies.placement import LateQueue, sibling_ranks
from rlsched.policies.predict import LengthPredictor


def _state(engines: int, tasks: int, samples: int, open_: int) -> tuple[ClusterState, LateQueue]:
    """One step of ``tasks`` x ``samples`` (a task's samples adjacent, as traces list them)
    queued; ``open_`` of the ``engines`` single-GPU engines are up (the others still
    switching in)."""
    batch = [(f"T{t}-{s}", f"task{t}") for t in range(tasks) for s in range(samples)]
    st = ClusterState(engines, 1, [batch], max_staleness=0)
    for e in range(open_):
        st.add_engine(EngineState(e, (e,), 0, 1000))
    q = LateQueue()
    q.add(0, [tid for tid, _ in batch])
    return st, q


def _tasks_per_engine(st: ClusterState, cmds) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for c in cmds:
        if isinstance(c, Dispatch):
            out.setdefault(c.engine, []).extend(st.trajs[t].task_id for t in c.trajectories)
    return out


def test_an_engine_that_opens_first_takes_a_share_of_every_group_not_whole_groups():
    # 2 engines, one up: it takes its cap (24 of 6 tasks x 8) as 4 samples of every task
    # (in queue order, before: tasks 0-2 whole, the long one's 8 samples on one engine)
    st, q = _state(2, 6, 8, open_=1)
    cmds = q.place(st, 24, lambda s: 0, LengthPredictor().remaining)
    (got,) = _tasks_per_engine(st, cmds).values()
    assert len(got) == 24 and all(got.count(f"task{t}") == 4 for t in range(6))
    # the second engine, up later, takes the other 4 of each
    _apply_dispatch(st, cmds)
    st.add_engine(EngineState(1, (1,), 0, 1000))
    cmds = q.place(st, 24, lambda s: 0, LengthPredictor().remaining)
    assert [c.engine for c in cmds] == [1]
    got = _tasks_per_engine(st, cmds)[1]
    assert all(got.count(f"task{t}") == 4 for t in range(6))


def test_engines_open_together_hold_no_two_siblings_while_there_is_room():
    # 4 engines up, 4 tasks x 4 samples, cap 4: every engine holds one sample of each task
    # (rank order alone would give engine e all of task e's samples: the least loaded of
    # equal loads is the one holding fewest siblings)
    st, q = _state(4, 4, 4, open_=4)
    per = _tasks_per_engine(st, q.place(st, 4, lambda s: 0, LengthPredictor().remaining))
    assert sorted(per) == [0, 1, 2, 3]
    assert all(sorted(ts) == ["task0", "task1", "task2", "task3"] for ts in per.values())


def test_sibling_ranks_interleave_the_groups():
    assert sibling_ranks(["a", "a", "b", "a", "b", "c"]) == [0, 1, 0, 2, 1, 0]
