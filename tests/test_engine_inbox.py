"""The engine's turn batching (``VllmEngine.step`` / ``submit``) over a fake vLLM core.

The logic under test sits above vLLM's ``LLMEngine`` (``add_request`` / ``step`` /
``abort_request``): which requests are admitted when, when a ``step`` call returns, and
what an abort gives back. ``FakeCore`` stands in for that engine core only (one token per
running request per iteration); the real engine is covered in ``tests/live/test_engine.py``.
Issue #11: a turn that became ready while a ``step`` call ran used to wait for that call to
end, so two trajectories on one engine took turns instead of sharing the batch.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest

from rlsched.cluster.errors import LiveBackendError
from rlsched.real.rollout.engine import EngineSettings, TurnRequest, VllmEngine


@dataclass
class _Completion:
    token_ids: list[int]
    finish_reason: str | None


@dataclass
class _RequestOutput:
    request_id: str
    outputs: list[_Completion]
    finished: bool


@dataclass
class FakeCore:
    """A fake of vLLM's engine core: every running request gains one token per ``step``;
    a request finishes at its ``max_tokens``. Records each iteration's batch size."""

    delay_s: float = 0.002
    running: dict[str, tuple[int, list[int]]] = field(default_factory=dict)  # rid -> (max, tokens)
    batches: list[int] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)

    def add_request(self, rid: str, prompt: dict, max_tokens: int) -> None:
        assert prompt["prompt_token_ids"]
        self.running[rid] = (max_tokens, [])

    def abort_request(self, rids: list[str]) -> None:
        for rid in rids:
            self.aborted.append(rid)
            self.running.pop(rid)

    def step(self) -> list[_RequestOutput]:
        time.sleep(self.delay_s)
        self.batches.append(len(self.running))
        outs = []
        for rid, (cap, toks) in list(self.running.items()):
            toks.append(len(toks) + 10)
            done = len(toks) >= cap
            outs.append(_RequestOutput(rid, [_Completion(list(toks), "length" if done else None)], done))
            if done:
                del self.running[rid]
        return outs


class FakeCoreEngine(VllmEngine):
    """``VllmEngine``'s request logic over a :class:`FakeCore` (no vLLM loaded)."""

    def __init__(self) -> None:
        self.settings = EngineSettings(model_dir="(fake)", max_model_len=256)
        self.engine_id, self.version = 0, 0
        self.core = FakeCore()
        self._init_batching()

    def _params(self, req: TurnRequest) -> int:  # the fake core takes max_tokens
        return req.max_tokens


def _turn(rid: str, tokens: int) -> TurnRequest:
    return TurnRequest(rid, [1, 2, 3], tokens)


def _in_thread(fn):
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("out", fn()))
    t.start()
    return t, box


def _until(cond, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.001)


def test_a_turn_submitted_during_a_step_joins_its_batch() -> None:
    eng = FakeCoreEngine()
    t, box = _in_thread(lambda: eng.step([_turn("long", 200)], [], max_seconds=30.0))
    _until(lambda: len(eng.core.batches) >= 3)
    eng.submit([_turn("short", 5)])
    t.join(30)
    rep = box["out"]
    # the submitted turn finished inside the running call, generated alongside "long"
    assert [(o.rid, o.finished, len(o.token_ids)) for o in rep.outputs] == [("short", True, 5)]
    assert "long" in eng.live and rep.running == 1
    assert eng.core.batches.count(2) == 5
    assert rep.iterations == len(eng.core.batches) and rep.batched == sum(eng.core.batches)


def test_an_aborted_turn_ends_the_running_step_with_its_tokens() -> None:
    eng = FakeCoreEngine()
    t, box = _in_thread(lambda: eng.step([_turn("a", 200)], [], max_seconds=30.0))
    _until(lambda: len(eng.core.batches) >= 3)
    eng.submit(abort=["a"])
    t.join(30)
    (out,) = box["out"].outputs
    assert out.rid == "a" and not out.finished
    assert len(out.token_ids) == len(eng.core.batches) >= 3  # every token it had made
    assert eng.core.aborted == ["a"] and not eng.live


def test_an_abort_that_arrives_before_its_turn_returns_it_unstarted() -> None:
    # submit and step run in two concurrency groups: their order is not guaranteed
    eng = FakeCoreEngine()
    eng.submit(abort=["x"])
    assert eng.step([], [], max_seconds=0.0).outputs == []
    rep = eng.step([_turn("x", 5)], [], max_seconds=1.0)
    assert [(o.rid, o.finished, o.token_ids) for o in rep.outputs] == [("x", False, [])]
    assert not eng.core.batches and not eng.live and not eng.core.running


def test_an_idle_step_waits_for_submitted_turns() -> None:
    eng = FakeCoreEngine()
    t0 = time.perf_counter()
    assert eng.step([], [], max_seconds=0.0).outputs == []
    assert time.perf_counter() - t0 < 0.5
    t1 = time.perf_counter()
    t, box = _in_thread(lambda: eng.step([], [], max_seconds=30.0))
    time.sleep(0.05)
    eng.submit([_turn("late", 3)])
    t.join(30)
    wall = time.perf_counter() - t1
    rep = box["out"]
    assert [o.rid for o in rep.outputs if o.finished] == ["late"]
    assert rep.seconds <= wall - 0.045  # the wait for the turn is not engine time
    assert rep.iterations == 3 and rep.batched == 3


def test_an_idle_step_with_nothing_submitted_ends_at_its_slice() -> None:
    eng = FakeCoreEngine()
    t0 = time.perf_counter()
    rep = eng.step([], [], max_seconds=0.2)
    assert rep.outputs == [] and rep.iterations == 0
    assert 0.15 < time.perf_counter() - t0 < 5.0


def test_submitted_turns_apply_in_order_and_check_their_length() -> None:
    eng = FakeCoreEngine()
    eng.submit([_turn("a", 2)])
    eng.submit(abort=["a"])
    rep = eng.step([], [], max_seconds=1.0)
    assert [(o.rid, o.finished) for o in rep.outputs] == [("a", False)]
    eng.submit([TurnRequest("big", [1] * 250, 10)])
    with pytest.raises(LiveBackendError, match="request big needs 260 tokens, over max_model_len=256"):
        eng.step([], [], max_seconds=1.0)
