"""A turn that generates no token still has its prompt prefilled, and ends when that prefill
does -- not when it joins the engine's batch. Found by the run invariant that no trajectory
runs faster than alone (``sim.invariants``), on a hypothesis example of the window-term hunt:
an engine's wake-up for two empty turns also ended a third whose one-token prompt was still
being prefilled, 0.1 s early."""

from __future__ import annotations

import heapq
import itertools

import pandas as pd
import pytest
from test_bound_hunt import COSTS

from rlsched.sim.engine import EngineSim

from simkit import APPROX, run, trace


def _times(tmp_path, rows, steps, gpus=2):
    out = run(trace(rows), steps, "colocated", gpus=gpus, cost=COSTS["kv"], out_dir=tmp_path / "r")
    assert out.result.complete  # (check=True: every run invariant held, solo times included)
    t = pd.read_parquet(tmp_path / "r" / "trajectories.parquet").set_index("trajectory")
    return t["finish_time"] - t["dispatch_time"], t["solo_seconds"]


def test_an_empty_turn_ends_when_its_prompt_is_prefilled(tmp_path):
    # prefill 0.1 s per token under this cost model: 10 tokens of prompt, no output
    took, solo = _times(tmp_path, [("t", "A", 0, 10, 0, 0.0)], [["A"]])
    assert solo["A"] > 1.0  # (the prompt's prefill, with its attention term)
    assert took["A"] == pytest.approx(solo["A"], **APPROX)


def test_a_wake_up_for_other_turns_does_not_end_it_early(tmp_path):
    # the hunt's example: S0T0 and S0T1 have nothing to do and end at once; S0T2 shares an
    # engine with one of them and must still wait for its one token of prompt
    rows = [("task0", "S0T0", 0, 0, 0, 0.0), ("task1", "S0T1", 0, 0, 0, 0.0),
            ("task0", "S0T2", 0, 1, 0, 0.0), ("task0", "S1T0", 0, 0, 0, 0.0)]
    took, solo = _times(tmp_path, rows, [["S0T0", "S0T1", "S0T2"], ["S1T0"]])
    assert took["S0T0"] == took["S0T1"] == 0.0
    assert solo["S0T2"] == pytest.approx(0.1, rel=1e-3)
    assert took["S0T2"] == pytest.approx(solo["S0T2"], **APPROX)


def test_it_ends_at_its_own_prefill_not_at_a_later_one():
    # one engine: the empty turn "b" (5 tokens of prompt) joins first, then "c"'s long prompt
    # extends the engine's stall; "b" ends when its own prefill does, "c" after its decode
    cost = COSTS["kv"]
    eng = EngineSim(0, 0, 1, cost, cost.kv_capacity_tokens(1))
    eng.queue, eng.eid, eng.wake_callbacks = [], itertools.count(), ()
    b_ready = eng.join(0.0, "b", 0, 5, 0)
    c_ready = eng.join(0.0, "c", 0, 60, 3)
    assert 0.0 < b_ready < c_ready == eng.stall_end
    ended: dict[str, float] = {}
    now = 0.0
    for _ in range(20):
        eng.rearm(now)
        now, *_ = heapq.heappop(eng.queue)
        eng.wake_at = float("inf")
        ended.update(dict.fromkeys(eng.pop_due(now), now))
        if len(ended) == 2:
            break
    assert ended["b"] == pytest.approx(b_ready, **APPROX)
    assert ended["c"] > c_ready
    assert not eng.prefilling
