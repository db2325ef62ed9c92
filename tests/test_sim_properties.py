"""Property tests: on random small traces every shipped policy keeps the invariants
(checked by --check inside the run), never beats its own lower bound, and is
deterministic for a seed."""

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlsched.policies import available

from simkit import HAND_COST, run, trace

SPECS = [
    "colocated",
    "async:rollout_fraction=0.5,staleness=0",
    "async:rollout_fraction=0.5,staleness=1",
    "async:rollout_fraction=0.25,staleness=2",
    "elastic",
    "elastic:staleness=1",
    "elastic:drain=finish_turn,tail=0.9,pack=4",
    "elastic:drain=interrupt,tail=1.0",
    "partial",
    "partial:finish_fraction=0.5,mode=train",
    "partial:finish_fraction=0.5,mode=drop",
    "partial:finish_fraction=1.0,budget_s=3",
]


@st.composite
def workloads(draw):
    n_traj = draw(st.integers(1, 8))
    rows = []
    for i in range(n_traj):
        turns = draw(st.integers(1, 4))
        for k in range(turns):
            rows.append((
                f"task{i % 3}", f"T{i}", k, draw(st.integers(0, 400)), draw(st.integers(0, 30)),
                draw(st.sampled_from([0.0, 0.5, 3.0, 17.0])),
            ))
    df = trace(rows)
    ids = [f"T{i}" for i in range(n_traj)]
    n_steps = draw(st.integers(1, 3))
    steps = [ids[s::n_steps] for s in range(n_steps)]
    steps = [s for s in steps if s]
    gpus = draw(st.sampled_from([2, 4, 8]))
    tp = draw(st.sampled_from([1, 2])) if gpus >= 4 else 1
    slots = draw(st.sampled_from([1, 2, 4096]))
    kv = draw(st.sampled_from([0.0, 1.0]))  # 1.0: tight KV so queueing/eviction happen
    return df, steps, gpus, tp, slots, kv


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), spec=st.sampled_from(SPECS))
def test_invariants_and_bound(w, spec):
    df, steps, gpus, tp, slots, kv = w
    cost = HAND_COST
    if kv:
        cost = replace(HAND_COST, kv_bytes_per_elem=0.5, gpu_mem_util=1.0, hbm_bytes=1e9 + 1200 * tp)
    out = run(df, steps, spec, gpus=gpus, tp=tp, sandbox_slots=slots, cost=cost, check=True)
    assert out.result.complete
    assert out.result.state.version == len(steps)
    assert out.result.makespan >= out.lower_bound_seconds - 1e-6


@settings(max_examples=15, deadline=None)
@given(w=workloads(), spec=st.sampled_from(SPECS))
def test_deterministic(w, spec):
    df, steps, gpus, tp, slots, _ = w
    a = run(df, steps, spec, gpus=gpus, tp=tp, sandbox_slots=slots)
    b = run(df, steps, spec, gpus=gpus, tp=tp, sandbox_slots=slots)
    assert a.result.makespan == b.result.makespan
    assert a.result.steps == b.result.steps


def test_all_shipped_policies_are_covered():
    assert {s.split(":")[0] for s in SPECS} <= set(available())
