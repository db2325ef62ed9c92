"""Issue 23: the ``Move`` command, late binding (the cluster queue) and ``max_num_seqs`` in
the simulator, with scripted policies (events in, commands out) on hand-computable
timelines, and ``Move``'s legality in ``legality.check``."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import replace

import pytest

from rlsched.cluster.commands import (
    Command,
    Dispatch,
    Move,
    Reassign,
    SetTimer,
    Train,
)
from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import PolicyError
from rlsched.cluster.events import Event, RolesChanged, TimerFired, TrajectoryFinished
from rlsched.cluster.ids import Role, TrajStatus
from rlsched.cluster.legality import check as legality_check
from rlsched.cluster.record import read_run
from rlsched.cluster.state import ClusterState, EngineState
from rlsched.cluster.view import ClusterView
from rlsched.policies import make_policy
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload

from simkit import APPROX, HAND_COST, trace

# prefill 1 s per new token (2 * params FLOPs at 1e9 FLOP/s), KV transfer 0.5 s per token
# (2 bytes at 4 B/s), decode still 1 s per step: moving a context is visibly charged, and a
# transfer (0.5 s/token) is cheaper than re-prefilling it (1 s/token)
MOVE_COST = replace(HAND_COST, prefill_eff=1e-12, kv_bytes_per_elem=1.0, kv_transfer_bw=4.0)
# an engine (tp 1) holds 30 tokens of KV (2 bytes each); decode stays ~1 s per step
KV30 = replace(HAND_COST, kv_bytes_per_elem=1.0, hbm_bytes=(1e9 + 61) / 0.9)


class Scripted:
    """A test policy: opens every GPU as rollout engines, then runs ``script`` (event ->
    commands) and trains each step once all of its trajectories finished."""

    name = "scripted"
    params = ()
    max_staleness = 0
    defers = False

    def __init__(self, script: Callable[[Event, ClusterView], Sequence[Command]],
                 engines: int | None = None) -> None:
        self.script = script
        self.engines = engines
        self.finished: dict[str, float] = {}
        self.seen: list[tuple[float, str, tuple]] = []

    def reset(self, view: ClusterView, rng: random.Random) -> None:
        self.finished.clear()

    def on_event(self, event: Event, view: ClusterView) -> list[Command]:
        cmds: list[Command] = []
        if type(event).__name__ == "RunStarted":
            cmds.append(Reassign(tuple(range(self.engines or view.num_gpus)), Role.ROLLOUT))
        if isinstance(event, TrajectoryFinished):
            self.finished[event.trajectory] = view.now
            s = view.trajectory(event.trajectory).step  # (one step: trained once, below)
            if view.unfinished(s) == 0 and view.finished(s):
                cmds.append(Reassign(view.gpus_in(Role.ROLLOUT) + view.gpus_in(Role.IDLE),
                                     Role.TRAIN))
                cmds.append(Train(view.finished(s)))
        cmds.extend(self.script(event, view))
        return cmds


def _run(df, ids: Sequence[str], policy: Scripted, *, gpus: int = 2, cost=MOVE_COST):
    w = Workload.from_frame(df)
    config = RunConfig(gpus=gpus, tp=1, steps=1, check=True)
    return simulate(w, [[(t, t) for t in ids]], policy, config, cost, spec="scripted")


ONE = trace([("t", "A", 0, 10, 10, 0.0)])
TWO = trace([("t", "A", 0, 10, 10, 0.0), ("t", "B", 0, 10, 10, 0.0)])


def _opened(event: Event) -> bool:
    return isinstance(event, RolesChanged) and event.role is Role.ROLLOUT


def test_a_moved_trajectory_loses_no_turn_and_is_charged_the_transfer():
    # alone on engine 0: switch 1 s, prefill 10 s, 10 decode steps -> done at 21
    base = Scripted(lambda ev, v: [Dispatch(("A",), 0)] if _opened(ev) else [])
    _run(ONE, ["A"], base)
    assert base.finished["A"] == pytest.approx(21.0, **APPROX)

    # moved to engine 1 at 14.5 (3 whole tokens produced): its 13 tokens of context arrive
    # by transfer (6.5 s; re-prefill would take 13 s) at 21.0, then 7 more steps
    def script(ev, v):
        if _opened(ev):
            return [Dispatch(("A",), 0), SetTimer(14.5, "move")]
        if isinstance(ev, TimerFired):
            assert v.trajectory("A").engine == 0 and v.trajectory("A").pinned
            return [Move(("A",), 1)]
        return []

    pol = Scripted(script)
    out = _run(ONE, ["A"], pol)
    secs, by_prefill = MOVE_COST.migrate_s(1, 13)
    assert (secs, by_prefill) == pytest.approx((6.5, False))
    assert pol.finished["A"] == pytest.approx(14.5 + secs + 7, **APPROX)
    ts, t = out.result.state.trajs["A"], out.result.trajs["A"]
    assert ts.status is TrajStatus.TRAINED and ts.turns_done == 1 and ts.migrations == 1
    assert t.generated == 10 and t.output_kept == 10 and t.wasted == 0
    assert ts.engine == 1


def test_move_to_the_cluster_queue_lets_the_cluster_place_it():
    # A and B pinned on engine 0 prefill one after the other (1..11, 11..21). At 14.5 A
    # (10 tokens of prompt prefilled, none generated) goes to the cluster queue: the
    # least-loaded engine where it fits is engine 1 (engine 0 still holds B); its 10
    # tokens arrive by transfer at 19.5 and it decodes 10 steps
    def script(ev, v):
        if _opened(ev):
            return [Dispatch(("A", "B"), 0), SetTimer(14.5, "move")]
        if isinstance(ev, TimerFired):
            return [Move(("A",))]
        return []

    pol = Scripted(script)
    out = _run(TWO, ["A", "B"], pol)
    ts = out.result.state.trajs["A"]
    assert ts.engine == 1 and not ts.pinned and ts.migrations == 1
    assert pol.finished["A"] == pytest.approx(14.5 + 5.0 + 10, **APPROX)
    assert pol.finished["B"] == pytest.approx(31.0, **APPROX)  # (A's prefill stays spent)
    assert out.result.trajs["A"].generated == 10


def test_a_full_engine_preempts_its_newest_sequence_and_requeues_it():
    # One engine holding 30 tokens of KV. A and B (10 prompt + 10 output tokens each) are
    # both admitted (admission reserves the prompt, as vLLM allocates prompt blocks); their
    # generated tokens fill the engine at 5 tokens each (t=6): B, the most recently
    # admitted, is preempted (recompute), keeps its 5 tokens and goes back to the head of
    # the cluster queue; A finishes at 11, B is readmitted, re-prefills its 15 tokens
    # (free here) and generates its last 5 tokens by 16.
    cost = KV30
    assert cost.kv_capacity_tokens(1) == 30
    pol = Scripted(lambda ev, v: [Dispatch(("A", "B"))] if _opened(ev) else [], engines=1)
    out = _run(TWO, ["A", "B"], pol, cost=cost)
    assert pol.finished["A"] == pytest.approx(11.0, **APPROX)
    assert pol.finished["B"] == pytest.approx(16.0, **APPROX)
    b = out.result.trajs["B"]
    assert b.generated == 10 and b.wasted == 0  # (nothing generated is lost)
    assert out.result.state.trajs["B"].status is TrajStatus.TRAINED


def test_a_pinned_sequence_preempted_waits_at_its_engines_head(tmp_path):
    pol = Scripted(lambda ev, v: [Dispatch(("A", "B"), 0)] if _opened(ev) else [], engines=1)
    w = Workload.from_frame(TWO)
    simulate(w, [[("A", "A"), ("B", "B")]], pol, RunConfig(gpus=2, tp=1, steps=1, check=True),
             KV30, spec="scripted", out_dir=tmp_path / "run")
    assert pol.finished == pytest.approx({"A": 11.0, "B": 16.0}, **APPROX)
    ev = read_run(tmp_path / "run").events
    pre = ev[ev.kind == "Preempt"]
    assert list(pre.trajectory) == ["B"] and list(pre.engine) == [0]
    assert list(pre.time) == pytest.approx([6.0], **APPROX)


def test_the_cluster_queue_is_visible_while_it_waits():
    cost = KV30
    seen = {}

    def script(ev, v):
        if _opened(ev):
            return [Dispatch(("A", "B")), SetTimer(8.0, "look")]  # (B preempted at 6)
        if isinstance(ev, TimerFired):
            seen["queue"] = v.cluster_queue()
            seen["B"] = v.trajectory("B")
            seen["totals"] = v.rollout_totals()
            seen["engine"] = v.engine(0)
        return []

    _run(TWO, ["A", "B"], Scripted(script, engines=1), cost=cost)
    assert seen["queue"] == ("B",)
    assert seen["B"].status is TrajStatus.QUEUED and seen["B"].engine is None
    assert not seen["B"].pinned
    assert seen["totals"].unbound == 1 and seen["totals"].live == 1
    assert seen["engine"].queued == 0 and seen["engine"].running == 1


def test_late_binding_uses_an_engine_pinning_would_leave_idle():
    cost = KV30
    # both pinned to engine 0: B is preempted there at 6 and waits for A although engine 1
    # is free
    pinned = Scripted(lambda ev, v: [Dispatch(("A", "B"), 0)] if _opened(ev) else [])
    _run(TWO, ["A", "B"], pinned, gpus=2, cost=cost)
    assert pinned.finished["B"] == pytest.approx(16.0, **APPROX)
    # unpinned: A on engine 0, B on engine 1, side by side
    free = Scripted(lambda ev, v: [Dispatch(("A", "B"))] if _opened(ev) else [])
    _run(TWO, ["A", "B"], free, gpus=2, cost=cost)
    assert free.finished["A"] == pytest.approx(11.0, **APPROX)
    assert free.finished["B"] == pytest.approx(11.0, **APPROX)


@pytest.mark.parametrize(("pin", "done"), [(None, 12.0), (0, 27.5)])
def test_an_unpinned_turn_that_finds_no_room_goes_elsewhere(pin, done):
    # Engines hold 30 tokens of KV. A: 13 tokens, a 5 s tool call, 13 more; D (engine 1)
    # is done at 3; C (pinned to engine 0 at 4.5) needs all 30 tokens and evicts A's idle
    # context. When A's tool call returns at 9 engine 0 is full: unpinned, A goes back to
    # the cluster queue and engine 1 admits it at once (done at 12); pinned to engine 0 it
    # waits for C (24.5), then decodes 3 steps
    cost = KV30
    df = trace([
        ("t", "A", 0, 10, 3, 5.0), ("t", "A", 1, 10, 3, 0.0),
        ("t", "C", 0, 10, 20, 0.0), ("t", "D", 0, 10, 2, 0.0),
    ])

    def script(ev, v):
        if _opened(ev):
            return [Dispatch(("A",), pin), Dispatch(("D",), 1), SetTimer(4.5, "c")]
        if isinstance(ev, TimerFired):
            return [Dispatch(("C",), 0)]
        return []

    pol = Scripted(script)
    out = _run(df, ["A", "C", "D"], pol, gpus=2, cost=cost)
    ts = out.result.state.trajs["A"]
    assert ts.turns_done == 2 and ts.status is TrajStatus.TRAINED
    assert out.result.trajs["A"].generated == 6
    assert pol.finished["A"] == pytest.approx(done, **APPROX)
    assert ts.engine == (1 if pin is None else 0)


def test_max_num_seqs_bounds_the_decode_batch():
    cap1 = replace(HAND_COST, max_num_seqs=1)
    df = trace([("t", "A", 0, 10, 3, 0.0), ("t", "B", 0, 10, 3, 0.0)])
    both = Scripted(lambda ev, v: [Dispatch(("A", "B"))] if _opened(ev) else [], engines=1)
    _run(df, ["A", "B"], both, cost=HAND_COST)
    assert both.finished == pytest.approx({"A": 4.0, "B": 4.0}, **APPROX)
    one = Scripted(lambda ev, v: [Dispatch(("A", "B"))] if _opened(ev) else [], engines=1)
    out = _run(df, ["A", "B"], one, cost=cap1)
    assert one.finished == pytest.approx({"A": 4.0, "B": 7.0}, **APPROX)
    # both were admitted at once (KV held); B waited for a decode slot, not for KV
    assert out.result.state.trajs["B"].dispatches == 1


# ------------------------------------------------------------------ legality
def _state() -> ClusterState:
    st = ClusterState(4, 1, [[("A", "t"), ("B", "t"), ("C", "t")]], 0)
    for e in range(3):
        st.add_engine(EngineState(e, (e,), 0, 100))
    st.engines_[2].drain()
    st.mark_active("A", TrajStatus.RUNNING, 0)
    st.trajs["A"].pinned = True
    st.mark_active("B", TrajStatus.QUEUED, None)  # type: ignore[arg-type]
    st.enqueue_unbound("B")
    return st


@pytest.mark.parametrize(("cmd", "msg"), [
    (Move(()), "Move with no trajectories"),
    (Move(("A", "A"), 1), "names a trajectory twice"),
    (Move(("Z",), 1), "unknown trajectory 'Z'"),
    (Move(("C",), 1), "Move of 'C' which is pending, not queued or running"),
    (Move(("A",), 2), "Move to engine 2, which is not an active rollout engine"),
    (Move(("A",), 7), "Move to engine 7, which is not an active rollout engine"),
    (Move(("A",), 0), "Move of 'A' to engine 0, where it already is"),
    (Move(("B",)), "Move of 'B' to the cluster queue, where it already waits"),
])
def test_illegal_moves_are_refused_in_one_line(cmd, msg):
    st = _state()
    with pytest.raises(PolicyError, match=msg.replace("(", r"\(")) as err:
        legality_check(st, cmd)
    assert "\n" not in str(err.value)


def test_legal_moves_pass():
    st = _state()
    for cmd in (Move(("A",), 1), Move(("A",)), Move(("B",), 0), Move(("A", "B"), 1)):
        legality_check(st, cmd)
    assert st.cluster_queue() == ("B",)
    assert st.rollout_totals().unbound == 1


@pytest.mark.parametrize("spec", ["colocated", "async:staleness=1", "elastic", "partial"])
def test_preemption_under_kv_pressure_keeps_every_invariant(tmp_path, spec):
    # 24 trajectories of 2-4 turns on engines holding 120 tokens: turns preempt each other
    # over and over; --check verifies the KV bound, the cluster queue and token conservation
    # at every event, and every trajectory is still trained whole
    rows = []
    for i in range(24):
        for k in range(2 + i % 3):
            # (each trajectory's whole context fits an empty engine: <= 4 x 25 tokens)
            rows.append((f"task{i % 4}", f"T{i:02d}", k, 5 + (i * 7 + k) % 8, 4 + (i * 5 + k) % 10,
                         float((i + k) % 4)))
    df = trace(rows)
    ids = [f"T{i:02d}" for i in range(24)]
    cost = replace(HAND_COST, kv_bytes_per_elem=1.0, hbm_bytes=(1e9 + 241) / 0.9)
    assert cost.kv_capacity_tokens(1) == 120
    w = Workload.from_frame(df)
    config = RunConfig(gpus=2, tp=1, steps=2, check=True)
    out = simulate(w, [[(t, t) for t in ids[:12]], [(t, t) for t in ids[12:]]],
                   make_policy(spec), config, cost, spec=spec, out_dir=tmp_path / "run")
    assert out.result.complete
    for tid, ts in out.result.state.trajs.items():
        assert ts.status is TrajStatus.TRAINED and ts.turns_done == 2 + int(tid[1:]) % 3
    assert out.result.makespan >= out.lower_bound_seconds
    kinds = set(read_run(tmp_path / "run").events.kind)
    assert "Preempt" in kinds
