"""Issue 23 item 5: the bound's window term (``sim/bound.py``: every GPU-second of steps
``a+k+1 .. b``'s rollout and ``a+1 .. b``'s training falls between ``E_a`` and ``E_b``).

It is strictly above every other term where a later step carries more work than its
longest trajectory takes alone (the chain let two batches run as a pair on a cluster that
cannot do both batches' work in that time), and no run of any policy -- every registered
one, a random legal schedule, with and without faults -- beats it on small crowded runs
(several trajectories per GPU, KV reads that batching cannot share), where it binds in
about one run in ten.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bound_hunt import COSTS, HUNT, SHIPPED, RandomLegal, faulted_run
from test_bound_terms import KV_COST

from rlsched.cluster.config import RunConfig
from rlsched.policies import available, parse_spec
from rlsched.sim.bound import (
    bound_terms,
    decode_engine_seconds,
    decode_engine_seconds_many,
    release_bound,
)
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload

from simkit import run, trace

# decode: 1 s of weight reads per step plus 0.01 s per context token of KV reads; an
# engine (tp 1) holds 1,700 tokens of KV, 4 sequences; prefill 0.001 s and training
# 0.003 s per token on one GPU (cheap: the decode's KV reads are the work)
CROWDED = replace(KV_COST, peak_flops=1e12)  # (test_bound_terms' KV cost, cheaper training)


def test_decode_engine_seconds_many_is_the_scalar_bound_per_entry():
    tokens = np.array([0.0, 1.0, 40.0, 1e6, 3.0])
    kv = np.array([0.0, 5.0, 16000.0, 1e12, 0.0])
    for cost in (CROWDED, *COSTS.values()):
        many = decode_engine_seconds_many(cost, 1, tokens, kv)
        assert many.tolist() == pytest.approx(
            [decode_engine_seconds(cost, 1, t, k) for t, k in zip(tokens, kv, strict=True)], rel=1e-12)


def test_window_term_charges_a_later_steps_work_after_the_step_before_it():
    # staleness 1, 2 GPUs. Step 0: A, one token then a 100 s tool call. Step 2: C1..C4,
    # 400-token prompts, 10 tokens each: alone one decodes in 10 x (1 + 4) = 50 s, so the
    # chain releases step 2 at E_0 + 50 (plus training); but all four decode between E_0
    # (version 1 exists) and E_2, and their KV reads are 4 x 10 x 4 = 160 engine-seconds
    # more than the 10 steps' weight reads -- 85 s on 2 GPUs, not 50.
    rows = [("t", "A", 0, 0, 1, 100.0), ("t", "B", 0, 0, 1, 0.0)]
    rows += [("t", f"C{i}", 0, 400, 10, 0.0) for i in range(4)]
    steps = [["A"], ["B"], [f"C{i}" for i in range(4)]]
    w = Workload.from_frame(trace(rows))
    b = [[(t, t) for t in s] for s in steps]
    cfg = RunConfig(gpus=2, tp=1, steps=3)
    terms = bound_terms(w, b, CROWDED, cfg, 1, False)
    # by hand: E_0 = first switch + A alone (1 s decode + 100 s tool) + its training on 2
    # GPUs; then the window [E_0, E_2]: step 2's decode (10 steps of 4) and the training of
    # steps 1 and 2 (GPU-seconds), over the 2 GPUs
    rate = CROWDED.peak_flops * CROWDED.train_mfu
    e0 = release_bound(CROWDED.switch_s, [(CROWDED.switch_s + 101.0, CROWDED.train_flops(1) / (2 * rate))])
    assert terms["chain"] >= e0
    decode = decode_engine_seconds(CROWDED, 1, 40, 4 * 10 * 400)
    assert decode == pytest.approx(10 * 1.0 + 160.0)
    train = (CROWDED.train_flops(1) + 4 * CROWDED.train_flops(410)) / rate
    hand = e0 + (decode + train) / 2
    assert terms["window"] == pytest.approx(hand, rel=1e-12)
    others = max(v for k, v in terms.items() if k != "window")
    assert terms["window"] > others + 30.0  # chain: E_0 + ~50 s; work: ~88 s in all
    for spec in ("async:staleness=1", "elastic:staleness=1", "async:rollout_fraction=0.5,staleness=1"):
        out = run(trace(rows), steps, spec, gpus=2, cost=CROWDED)
        assert out.result.complete
        assert out.bound_terms["window"] == pytest.approx(terms["window"])
        assert out.result.makespan >= out.lower_bound_seconds * (1 - 1e-9) >= terms["window"] * (1 - 1e-9)


def test_window_term_is_the_chain_where_no_window_has_more_work():
    # one trajectory a step: every window's work is one trajectory's, less than its chain
    rows = [("t", f"T{i}", 0, 10, 3, 1.0) for i in range(3)]
    w = Workload.from_frame(trace(rows))
    b = [[(f"T{i}", f"T{i}")] for i in range(3)]
    for k in (0, 1):
        terms = bound_terms(w, b, CROWDED, RunConfig(gpus=2, tp=1, steps=3), k, False)
        assert terms["window"] == terms["chain"]
    # a deferring policy gets the whole-run bound for both
    terms = bound_terms(w, b, CROWDED, RunConfig(gpus=2, tp=1, steps=3), 1, True)
    assert terms["window"] == terms["chain"]


@st.composite
def crowded_runs(draw):
    """2-4 steps of 1-7 trajectories (1-2 turns, prompts up to 60 tokens, outputs up to 15)
    on 2-4 GPUs: several trajectories per GPU, so later steps' work can outweigh their
    longest trajectory."""
    n_steps = draw(st.integers(2, 4))
    rows, steps = [], []
    for s in range(n_steps):
        ids = []
        for i in range(draw(st.integers(1, 7))):
            tid = f"S{s}T{i}"
            for k in range(draw(st.integers(1, 2))):
                rows.append((f"task{i % 2}", tid, k, draw(st.integers(0, 60)), draw(st.integers(0, 15)),
                             draw(st.sampled_from([0.0, 0.0, 0.5, 4.0]))))
            ids.append(tid)
        steps.append(ids)
    return trace(rows), steps, draw(st.sampled_from([2, 3, 4])), draw(st.integers(0, 2))


def test_the_policies_below_cover_every_registered_one():
    assert {parse_spec(s)[0] for s in SHIPPED} >= set(available())


@settings(max_examples=150 * HUNT, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=crowded_runs(), spec=st.sampled_from(SHIPPED), cost=st.sampled_from(sorted(COSTS)))
def test_no_policy_beats_the_window_term_on_crowded_runs(w, spec, cost):
    df, steps, gpus, _ = w
    gpus = max(gpus, 2) if gpus % 2 == 0 else gpus + 1
    out = run(df, steps, spec, gpus=gpus, cost=COSTS[cost])
    assert out.result.complete
    assert out.result.makespan >= out.bound_terms["window"] * (1 - 1e-9), (
        f"{spec} beat the window term: {out.result.makespan} < {out.bound_terms}")


@settings(max_examples=150 * HUNT, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=crowded_runs(), seed=st.integers(0, 2**31 - 1), cost=st.sampled_from(sorted(COSTS)))
def test_no_random_legal_schedule_beats_the_window_term_on_crowded_runs(w, seed, cost):
    df, steps, gpus, k = w
    batches = [[(t, t) for t in s] for s in steps]
    out = simulate(Workload.from_frame(df), batches, RandomLegal(seed, k),
                   RunConfig(gpus=gpus, tp=1, steps=len(steps), check=True), COSTS[cost], spec="random-legal")
    assert out.result.complete
    assert out.result.makespan >= out.bound_terms["window"] * (1 - 1e-9), (
        f"beat the window term: {out.result.makespan} < {out.bound_terms}")


@settings(max_examples=60 * HUNT, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=crowded_runs(), spec=st.sampled_from(SHIPPED), cost=st.sampled_from(sorted(COSTS)),
       seed=st.integers(0, 1000),
       kinds=st.sets(st.sampled_from(["gpu", "tool", "trainer", "sync"]), min_size=1))
def test_no_policy_beats_the_window_term_on_crowded_runs_under_faults(w, spec, cost, seed, kinds):
    # (faults take GPUs away and add work: the window's GPU-seconds only grow)
    out = faulted_run(w, spec, cost, seed, kinds)
    if out is not None:
        assert out.result.makespan >= out.bound_terms["window"] * (1 - 1e-9)
