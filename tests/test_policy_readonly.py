"""Issue 22: policies only read the cluster, and only through ``ClusterView``.

Dynamically: every shipped policy (and the oracle reference) runs on a small trace, with
and without worker faults, behind :class:`ReadOnlyView` -- a guard that raises on any
attribute write and on any member that is not part of the view -- and produces exactly the
run it produces unguarded. Statically: every attribute a policy module reads off a
parameter typed ``ClusterView`` is a ``ClusterView`` member. And the legality check, a
pure function of the view, answers the same through the guard as on the store.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from rlsched.cluster import legality
from rlsched.cluster.commands import (
    Command,
    Dispatch,
    Drop,
    Interrupt,
    Move,
    OptimizerStep,
    Reassign,
    SetTimer,
    SyncWeights,
    Train,
)
from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import PolicyError
from rlsched.cluster.events import Event
from rlsched.cluster.faults import Fault, FaultSchedule
from rlsched.cluster.ids import Role, TrajStatus
from rlsched.cluster.state import ClusterState, EngineState
from rlsched.cluster.view import VIEW_MEMBERS, ClusterView, ReadOnlyView
from rlsched.policies import available, make_policy
from rlsched.policies.oracle import Oracle
from rlsched.sim.run import simulate

from simkit import HAND_COST, synthetic

ROOT = Path(__file__).resolve().parents[1]
FAULTS = FaultSchedule((Fault("gpu", per_hour=6.0), Fault("tool", per_hour=60.0),
                        Fault("trainer", per_hour=3.0), Fault("sync", per_hour=6.0)), seed=3)


class Guarded:
    """Runs ``inner`` with every view it is handed wrapped in :class:`ReadOnlyView`."""

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        self.inner = inner
        self.name, self.params = inner.name, inner.params
        self.max_staleness, self.defers = inner.max_staleness, inner.defers

    def reset(self, view: ClusterView, rng: random.Random) -> None:
        self.inner.reset(ReadOnlyView(view), rng)

    def on_event(self, event: Event, view: ClusterView) -> Sequence[Command]:
        return self.inner.on_event(event, ReadOnlyView(view))


def _policies() -> list[tuple[str, object]]:
    """(id, batches -> a fresh policy) of every shipped policy, a few variants, the oracle."""
    specs = [*available(), "async:staleness=0", "elastic:staleness=1", "partial:mode=drop"]
    return [(s, lambda batches, s=s: make_policy(s)) for s in specs] + [
        ("oracle", lambda batches: Oracle.from_lengths({t: 3 for b in batches for t, _ in b}, staleness=1))]


def _outcome(build, faults, guard: bool):  # type: ignore[no-untyped-def]
    w, batches = synthetic(6, 3, steps=3, seed=1)
    policy = build(batches)
    cfg = RunConfig(gpus=8, tp=2, steps=len(batches), check=True, faults=faults)
    r = simulate(w, batches, Guarded(policy) if guard else policy, cfg, HAND_COST).result
    return r.complete, r.makespan, r.events_processed, r.steps, r.faults


@pytest.mark.parametrize("faults", [None, FAULTS], ids=["plain", "faults"])
@pytest.mark.parametrize(("spec", "build"), _policies(), ids=[s for s, _ in _policies()])
def test_every_policy_only_reads_the_view(spec, build, faults):
    guarded = _outcome(build, faults, True)
    assert guarded[0], spec
    assert faults is None or sum(guarded[4].values()) > 0  # (the faults fired)
    assert guarded == _outcome(build, faults, False)


class _Writer:
    """A policy that breaks the rule in one of three ways."""

    name, params, max_staleness, defers = "writer", (), 0, False

    def __init__(self, how: str) -> None:
        self.how = how

    def reset(self, view: ClusterView, rng: random.Random) -> None:
        pass

    def on_event(self, event: Event, view: ClusterView) -> Sequence[Command]:
        if self.how == "assign":
            view.max_staleness = 5  # type: ignore[misc]
        elif self.how == "store":
            view.roles[0] = Role.TRAIN  # type: ignore[attr-defined]
        else:
            view.advance(1.0)  # type: ignore[attr-defined]
        return []


@pytest.mark.parametrize("how", ["assign", "store", "call"])
def test_the_guard_sees_a_write(how):
    w, batches = synthetic(2, 1, steps=1)
    cfg = RunConfig(gpus=2, tp=1, steps=1)
    with pytest.raises(AttributeError, match="read-only ClusterView"):
        simulate(w, batches, Guarded(_Writer(how)), cfg, HAND_COST)


@pytest.mark.parametrize("how", ["assign", "store", "call"])
def test_check_runs_hand_policies_the_guard(how):
    """With ``check`` (``--check``; live runs always) the driver loop itself hands the policy
    the read-only view: no wrapper needed to catch a write."""
    w, batches = synthetic(2, 1, steps=1)
    cfg = RunConfig(gpus=2, tp=1, steps=1, check=True)
    with pytest.raises(AttributeError, match="read-only ClusterView"):
        simulate(w, batches, _Writer(how), cfg, HAND_COST)


def _view_reads(source: str, filename: str) -> list[str]:
    """``file:line .attr`` for every attribute read off a ``ClusterView`` parameter that is
    not a ClusterView member."""
    bad = []
    for fn in ast.walk(ast.parse(source, filename=filename)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        names = {a.arg for a in fn.args.args + fn.args.kwonlyargs
                 if a.annotation is not None and "ClusterView" in ast.unparse(a.annotation)}
        for node in ast.walk(fn):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in names and node.attr not in VIEW_MEMBERS):
                bad.append(f"{filename}:{node.lineno} .{node.attr}")
    return bad


def test_policies_use_only_view_members():
    files = sorted((ROOT / "policies").glob("*.py"))
    assert len(files) > 5
    bad = [b for f in files for b in _view_reads(f.read_text(), str(f.relative_to(ROOT)))]
    assert bad == []
    # every function of a policy module that takes a ``view`` says it is a ClusterView
    untyped = [f"{f.name}:{fn.lineno}" for f in files for fn in ast.walk(ast.parse(f.read_text()))
               if isinstance(fn, ast.FunctionDef)
               for a in fn.args.args if a.arg == "view" and (a.annotation is None or
                                                               "ClusterView" not in ast.unparse(a.annotation))]
    assert untyped == []


def test_the_static_check_sees_a_store_read():
    src = ("def f(view: ClusterView, x):\n    view.roles[0] = 1\n    return view.engines(), x.roles\n"
           "def g(view: 'ClusterView | None'):\n    return view.trajs\n")
    assert _view_reads(src, "p.py") == ["p.py:2 .roles", "p.py:5 .trajs"]


def _state() -> ClusterState:
    st = ClusterState(8, 2, [[("a", "t"), ("b", "t"), ("c", "t")]], max_staleness=0)
    st.roles.assign(range(4), Role.ROLLOUT)
    st.roles.assign(range(4, 8), Role.TRAIN)
    for e in (0, 1):
        st.add_engine(EngineState(e, (2 * e, 2 * e + 1), 0, 1000))
    st.engines_[1].drain()
    st.mark_active("b", TrajStatus.RUNNING, 0)
    st.trajs["b"].pinned = True
    st.engines_[0].admit("b")
    st.mark_active("c", TrajStatus.RUNNING, 0)
    st.mark_finished("c", TrajStatus.DONE)
    st.trajs["c"].min_version = 0
    st.version = 1
    st.set_trainer_floor(4, 2, why="memory")
    st.advance(5.0)
    return st


CASES = [
    Dispatch(("a",)), Dispatch(("b",)), Dispatch(("x",)), Dispatch(("a",), 1), Dispatch(("a",), 7),
    Reassign((), Role.IDLE), Reassign((0, 0), Role.IDLE), Reassign((0,), Role.SWITCHING),
    Reassign((9,), Role.IDLE), Reassign((4, 5), Role.ROLLOUT), Reassign((4,), Role.IDLE),
    Reassign((2,), Role.IDLE), Reassign((0, 1), Role.ROLLOUT), Reassign((0, 1), Role.IDLE),
    Train(()), Train(("c",)), Train(("a",)), OptimizerStep(), SyncWeights((1,)), SyncWeights((5,)),
    Move(("b",), 0), Move(("b",), None), Move(("b", "b"), None), Move(("a",), None), Move((), 0),
    Interrupt(("b",)), Interrupt(("a",)), Drop(("c",)), Drop(("b",)), Drop(("zz",)),
    SetTimer(4.0, "x"), SetTimer(6.0, "x"),
]


def _answer(fn, cmd) -> str:  # type: ignore[no-untyped-def]
    try:
        fn(cmd)
    except PolicyError as err:
        return str(err)
    return "ok"


def test_legality_is_a_function_of_the_view():
    st = _state()
    store = [_answer(lambda c: legality.check(st, c), c) for c in CASES]
    guarded = [_answer(lambda c: legality.check(ReadOnlyView(st), c), c) for c in CASES]
    assert store == guarded
    assert store.count("ok") >= 5 and len(set(store)) > 15  # (the cases reach many rules)
    assert "below its floor of 4 (memory)" in store[CASES.index(Reassign((4,), Role.IDLE))]
    assert "exceeds staleness bound 0" in store[CASES.index(Train(("c",)))]
