"""``async`` without a driver: batch s starts only when every engine holds version s-k.

Live, engines report ``WeightsSynced`` one by one; dispatching the next batch on the
first report let an engine still on the older weights generate its first tokens, and the
driver then refused to train it (staleness k+1, seen in a live lookup run at step 17)."""

from __future__ import annotations

import random

from rlsched.cluster.commands import Dispatch, Reassign
from rlsched.cluster.events import RolesChanged, RunStarted, WeightsSynced
from rlsched.cluster.ids import Role
from rlsched.cluster.state import ClusterState, EngineState
from rlsched.policies import make_policy


def _started(steps: int = 4) -> tuple[ClusterState, object, list]:
    batches = [[(f"T{s}-{i}", "task") for i in range(2)] for s in range(steps)]
    pol = make_policy("async:rollout_fraction=0.5,staleness=1")
    st = ClusterState(8, 2, batches, max_staleness=pol.max_staleness)
    pol.reset(st, random.Random(0))
    rollout, train = pol.on_event(RunStarted(), st)
    assert isinstance(rollout, Reassign) and rollout.role is Role.ROLLOUT
    for g in rollout.gpus:
        st.roles[g] = Role.ROLLOUT
    for g in train.gpus:
        st.roles[g] = Role.TRAIN
    for e in sorted({st.engine_of(g) for g in rollout.gpus}):
        st.add_engine(EngineState(e, st.engine_gpus(e), 0, 1000))
    first = list(pol.on_event(RolesChanged(rollout.gpus, Role.ROLLOUT), st))
    return st, pol, first


def _dispatched(cmds) -> list[str]:
    return [t for c in cmds if isinstance(c, Dispatch) for t in c.trajectories]


def test_next_batch_waits_for_the_last_engine_to_sync() -> None:
    st, pol, first = _started()
    assert _dispatched(first) == ["T0-0", "T0-1", "T1-0", "T1-1"]  # versions 0 and 0+k
    e0, e1 = st.engines()
    st.engines_[e0].version = 1
    assert _dispatched(pol.on_event(WeightsSynced((e0,), 1), st)) == []  # e1 still on 0
    st.engines_[e1].version = 1
    assert _dispatched(pol.on_event(WeightsSynced((e1,), 1), st)) == ["T2-0", "T2-1"]


def test_one_event_for_every_engine_dispatches_at_once() -> None:
    st, pol, _ = _started()
    for e in st.engines():
        st.engines_[e].version = 1
    assert _dispatched(pol.on_event(WeightsSynced(tuple(st.engines()), 1), st)) == ["T2-0", "T2-1"]
