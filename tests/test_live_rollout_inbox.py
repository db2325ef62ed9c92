"""The live driver's rollout side feeds engines without waiting for their running call.

Logic above the engine actors and environments (``real/loop/rollout.py``): which turns go
to a running ``step`` call through ``submit``, when a new call is started, and what an
abort that crosses a finished turn does. ``FakeActor`` records the calls a Ray engine actor
would get and ``FakeHost`` stands in for the live driver's clock, recorder and environment
pool; the cluster state and the trajectories' token bookkeeping are the real classes. The
same paths run on real engines in ``tests/live/test_driver.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from rlsched.cluster.ids import TrajStatus
from rlsched.cluster.state import ClusterState, EngineState
from rlsched.real.config import LiveSettings
from rlsched.real.loop.rollout import EngineHandle, Rollout
from rlsched.real.rollout.agent_loop import AgentTrajectory, ChatFormat
from rlsched.real.rollout.engine import INBOX, StepReport, TurnOutput


class _Method:
    def __init__(self, actor: FakeActor, name: str, group: str | None = None) -> None:
        self.actor, self.name, self.group = actor, name, group

    def options(self, concurrency_group: str) -> _Method:
        return _Method(self.actor, self.name, concurrency_group)

    def remote(self, *args: Any) -> tuple:
        call = (self.name, self.group, *args)
        self.actor.calls.append(call)
        return call


class FakeActor:
    """Records the engine-actor calls (``step``, ``submit``) the rollout side makes."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.step = _Method(self, "step")
        self.submit = _Method(self, "submit")

    def sent(self, name: str) -> list[list[str]]:
        """Request ids of each call of ``name``."""
        return [[r.rid for r in c[2]] for c in self.calls if c[0] == name]


class FakeCodec:
    eos_id = None
    format = ChatFormat("", "\n", "\n", "")

    def encode(self, text: str) -> list[int]:
        return [7] * max(1, len(text.split()))

    def decode(self, ids: list[int]) -> str:
        return "x " * len(ids)


@dataclass
class FakeHost:
    """The live driver's surface that ``Rollout`` uses; env calls and Ray futures are kept
    for the test to complete by hand."""

    st: ClusterState
    trajs: dict[str, AgentTrajectory]
    settings: LiveSettings
    codec: FakeCodec
    seed: int = 0
    tokens_generated: int = 0
    engine_busy_seconds: float = 0.0
    engine_iterations: int = 0
    engine_batched: int = 0
    engine_submits: int = 0

    def __post_init__(self) -> None:
        self.env_calls: list[tuple] = []
        self.pending: list[tuple] = []  # (ref, callback) of Ray calls
        self.finished: list[tuple] = []
        self.rec = SimpleNamespace(event=lambda *a, **k: None)
        self.timeline = SimpleNamespace(set=lambda *a: None)

    def now(self) -> float:
        return 0.0

    def env_call(self, tid: str, epoch: int, kind: str, text: str = "") -> None:
        self.env_calls.append((tid, epoch, kind))

    def ray_call(self, ref: Any, cb: Any, *, engine: int = -1) -> None:
        self.pending.append((ref, cb))

    def emit(self, ev: Any) -> None:
        pass

    def finish(self, tid: str, status: TrajStatus, e: int, note: str = "") -> None:
        self.st.mark_finished(tid, status)
        self.finished.append((tid, status))

    def maybe_close_engine(self, e: int) -> None:
        pass

    def close_env(self, env: Any) -> None:
        pass


def _setup(engines: int = 1) -> tuple[FakeHost, Rollout, list[FakeActor]]:
    tids = ["t0", "t1"]
    st = ClusterState(engines, 1, [[(t, "task") for t in tids]], 0)
    trajs = {}
    for t in tids:
        a = AgentTrajectory(t, "task", 0, 0)
        a.token_ids, a.loss_mask, a.started = [1, 2, 3], [0, 0, 0], True
        trajs[t] = a
    host = FakeHost(st, trajs, LiveSettings(max_tokens_per_turn=8, max_turns=3), FakeCodec())
    ro = Rollout(host)  # type: ignore[arg-type]
    actors = []
    for e in range(engines):
        st.add_engine(EngineState(e, (e,), 0, 100_000))
        actors.append(FakeActor())
        ro.engines[e] = EngineHandle(e, (e,), actors[-1], 0, 100_000)
    return host, ro, actors


def _reply(host: FakeHost, actor: FakeActor, outputs: list[TurnOutput]) -> None:
    """Complete the actor's outstanding ``step`` call with ``outputs``."""
    (i,) = [k for k, (ref, _) in enumerate(host.pending) if ref[0] == "step" and ref in actor.calls]
    _, cb = host.pending.pop(i)
    cb(StepReport(outputs, 0, 0, sum(len(o.token_ids) for o in outputs), 0.01, 8, 16))


def test_a_turn_ready_during_a_step_goes_to_that_step() -> None:
    host, ro, (actor,) = _setup()
    ro.dispatch("t0", 0)
    ro.dispatch("t1", 0)  # the first call is running: this turn is submitted to it
    assert actor.sent("step") == [["t0#0"]]
    assert actor.sent("submit") == [["t1#0"]]
    assert [c[1] for c in actor.calls] == [None, INBOX]
    assert host.engine_submits == 1
    _reply(host, actor, [TurnOutput("t0#0", [5] * 8, True, False, 0.1)])
    assert host.env_calls == [("t0", 0, "step")]  # t0's turn went to its tool call
    # t1's turn is still owed by the engine: a new call goes out at once to collect it
    assert actor.sent("step") == [["t0#0"], []]
    assert (host.engine_iterations, host.engine_batched) == (8, 16)


def test_an_abort_that_crosses_a_finished_turn_does_not_stall_it() -> None:
    host, ro, (a0, a1) = _setup(engines=2)
    ro.dispatch("t0", 0)
    ro.dispatch("t1", 1)
    # engine 0 drains (migrate): t0's request is aborted there (submitted to the running
    # call) and t0 is admitted on engine 1, where its turn waits for the partial output
    host.st.engines_[0].drain()
    ro.move_out("t0", 0)
    assert host.st.trajs["t0"].engine == 1
    assert a0.sent("submit") == [[]] and a0.calls[-1][3] == ["t0#0"]
    assert ro.rt["t0"].pending_abort and ro.rt["t0"].want_turn
    # ... but the turn had already finished on engine 0: no partial output will come
    _reply(host, a0, [TurnOutput("t0#0", [5] * 8, True, False, 0.1)])
    assert not ro.rt["t0"].pending_abort and not ro.rt["t0"].want_turn
    assert host.env_calls == [("t0", 0, "step")]
    ro.on_env("t0", 0, "step", SimpleNamespace(seconds=0.0, done=False, reward=0.0, observation="ok"))
    # the next turn goes to engine 1 (before the fix it waited forever for an abort reply)
    assert "t0#1" in [rid for call in a1.sent("step") + a1.sent("submit") for rid in call]
    assert host.st.trajs["t0"].engine == 1 and host.st.trajs["t0"].status is TrajStatus.RUNNING


def test_an_interrupt_keeping_progress_during_a_tool_call_keeps_the_finished_turns_version():
    """``partial`` interrupts keeping progress; a trajectory whose generated turn is in its
    tool call has finished that turn, so the tool call's return records it at the version
    that generated it (it was recorded at -1 and the run's trace was refused when written)."""
    from rlsched.real.loop.rollout import TrajRuntime, _drop_partial
    from rlsched.real.rollout.agent_loop import AgentTrajectory

    t, rt = AgentTrajectory("T0", "task", 0, 0), TrajRuntime()
    t.add_output([5, 6, 7], version=3)
    out, v = t.finish_turn(3)
    rt.last_version, rt.in_env = v, True  # (as turn_generated leaves it)
    _drop_partial(t, rt)
    t.record_turn(len(out), 1.0, rt.last_version)  # (as on_env records it)
    assert [r.version for r in t.rows] == [3] and t.wasted == 0
    # a turn still generating is lost, and so is its version
    t.add_output([8], version=4)
    rt.turn_version, rt.in_env = 4, False
    _drop_partial(t, rt)
    assert rt.turn_version == -1 and t.partial == [] and t.wasted == 1
