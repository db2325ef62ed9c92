"""Regressions for simulator and policy bugs found in review, one test (or property) each.

* the simulator reported ``EngineInfo.kv_used == 0`` always, so elastic's ``kv_limit``
  guard never changed a decision;
* elastic stalled: a consolidation landed its GPUs in the trainer after the step ended
  (plain synthetic workload); with ``tail=0`` or ``min_engines >= engines`` nothing ever
  went to training; and an engine livelocked at huge simulated times (a finish nearer
  than the clock resolves was re-armed for "now" forever);
* an engine ended a turn up to 1e-6 relative too early (a stale wake-up within pop_due's
  tolerance), so a run could finish below its lower bound;
* the trajectory processor with ``partial`` mode=train/drop raised TraceError when a fork
  kept more turns than its interrupted parent.

Runs here use the default cost model (not ``simkit.HAND_COST``) so the KV numbers are a
real model's, or ``FINE`` where a timing must be exact. Every run is under an *event budget*: a stalled or livelocked run fails
with a message instead of hanging the suite.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pandas as pd
import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlsched.cluster.commands import Reassign
from rlsched.cluster.config import RunConfig
from rlsched.cluster.ids import Role, TrajStatus
from rlsched.policies import make_policy
from rlsched.sim.cost import CostModel
from rlsched.sim.engine import EngineSim
from rlsched.sim.run import SimOutcome, simulate
from rlsched.sim.workload import Workload
from rlsched.traces import draw_batches, load_trace, sample_trace_path

from simkit import synthetic

COST = CostModel()
COLUMNS = ["task_id", "trajectory_id", "turn", "prompt_tokens", "output_tokens", "env_seconds"]


class Runaway(AssertionError):
    """The simulation processed more events than its work can need: it is not progressing."""


@contextmanager
def event_budget(limit: int) -> Iterator[None]:
    """Fail a simulation that processes more than ``limit`` SimPy events (a livelock
    never ends and a stall may take simulated time far away before it shows)."""
    step = simpy.Environment.step
    count = 0

    def counted(env: simpy.Environment) -> None:
        nonlocal count
        count += 1
        if count > limit:
            raise Runaway(f"more than {limit} simulated events (t={env.now:g} s): no progress")
        step(env)

    simpy.Environment.step = counted  # type: ignore[method-assign]
    try:
        yield
    finally:
        simpy.Environment.step = step  # type: ignore[method-assign]


def budget_for(workload: Workload, batches, gpus: int) -> int:
    """Generous: a few events per simulated turn plus role switches per GPU per step."""
    turns = sum(int(workload.turns[workload.index[t]]) for b in batches for _, t in b)
    return 50 * turns + 50 * gpus * max(1, len(batches)) + 1000


def sim(workload: Workload, batches, spec: str, *, gpus: int, tp: int, cost: CostModel = COST,
        policy=None, bound: bool = True, **cfg) -> SimOutcome:
    policy = policy or make_policy(spec)
    config = RunConfig(gpus=gpus, tp=tp, steps=len(batches), check=True, **cfg)
    with event_budget(budget_for(workload, batches, gpus)):
        out = simulate(workload, batches, policy, config, cost, spec=spec)
    assert out.result.complete
    assert out.result.state.version == len(batches)
    if bound:
        assert out.result.makespan >= out.lower_bound_seconds - 1e-6
    return out



# --------------------------------------------------------------- 1. KV use is reported
def long_and_short() -> tuple[Workload, list[list[tuple[str, str]]]]:
    """4 engines (tp=1) each get one long trajectory (a 40k-token prompt, 10 turns) and one
    short one; once the short ones finish, the tail is the four long contexts (~160k
    tokens, 17% of the four engines' KV, 68% of one engine's)."""
    rows = [("L", f"L{i}", k, 40_000 if k == 0 else 100, 200, 5.0) for i in range(4) for k in range(10)]
    rows += [("S", f"S{i}", 0, 100, 10, 0.0) for i in range(4)]
    w = Workload.from_frame(pd.DataFrame(rows, columns=COLUMNS))
    return w, [[(t, t) for t in ("L0", "L1", "L2", "L3", "S0", "S1", "S2", "S3")]]


def watch(spec: str, seen: list, released: list):
    """The policy of ``spec``, recording every engine's view and every release to TRAIN."""
    policy = make_policy(spec)
    decide = policy.on_event

    def on_event(event, view):
        cmds = decide(event, view)
        for e in view.engines():
            info = view.engine(e)
            on_it = [view.trajectory(t) for s in range(view.num_steps) for t in view.batch(s)]
            held = sum(t.tokens for t in on_it if t.engine == e and t.status is TrajStatus.RUNNING)
            seen.append((info, held))
        released.extend(c.gpus for c in cmds if isinstance(c, Reassign) and c.role is Role.TRAIN)
        return cmds

    policy.on_event = on_event  # type: ignore[method-assign]
    return policy


def test_engines_report_the_kv_they_hold():
    w, batches = long_and_short()
    seen: list = []
    sim(w, batches, "elastic", gpus=4, tp=1, policy=watch("elastic", seen, []))
    assert max(info.kv_used for info, _ in seen) >= 40_000
    for info, held in seen:
        assert 0 <= info.kv_used <= info.kv_capacity
        # (no KV pressure here, so nothing is evicted: every admitted context is resident)
        assert info.kv_used >= held
        if info.running == 0:
            assert info.kv_used == 0


def test_kv_limit_changes_elastic_consolidation():
    """By load the tail fits on 2 engines; by KV (~40k tokens per long context) it needs
    1 engine at kv_limit=1, 3 at kv_limit=0.25, 4 at kv_limit=0.01 -- so the first
    release hands 2, 1 or no busy engine to the trainer. An engine that empties goes
    whatever the limit (it holds no KV): at 0.01 the first release is engine 0, the first
    whose long trajectory ends."""
    w, batches = long_and_short()
    first = {}
    for kv_limit in (1.0, 0.25, 0.01):
        spec = f"elastic:tail=0.6,kv_limit={kv_limit}"
        released: list = []
        sim(w, batches, spec, gpus=4, tp=1, policy=watch(spec, [], released))
        first[kv_limit] = released[0]
    assert first[1.0] == (2, 3)
    assert first[0.25] == (3,)
    assert first[0.01] == (0,)  # only engines that emptied


# ------------------------------------------------------------------ 2. elastic stalls
def test_elastic_finishes_a_plain_synthetic_workload():
    """A consolidation issued in the step's last moments landed its GPUs in the trainer
    after the optimizer step; the next dispatch waited for them forever."""
    w, batches = synthetic(16, 8)
    sim(w, batches, "elastic", gpus=32, tp=4)


@pytest.mark.parametrize(("spec", "gpus", "tp"), [
    ("elastic:tail=0.0", 16, 4),  # never in a tail: nothing went to training
    ("elastic:min_engines=4", 16, 4),  # min_engines == engines
    ("elastic:min_engines=4096", 16, 4),  # min_engines > engines
    ("elastic:tail=0.0,staleness=1", 16, 4),
    ("elastic:min_engines=8,staleness=2,train_share=0.0", 16, 4),
    ("elastic:min_engines=2", 8, 4),  # two engines, both kept
])
def test_elastic_edges_make_progress(spec, gpus, tp):
    w, batches = synthetic(6, 3, steps=3, seed=1)
    sim(w, batches, spec, gpus=gpus, tp=tp)


def test_engine_wakes_when_a_finish_is_below_the_clock_resolution():
    """At t=1e12 s a clock tick is ~1.2e-4 s; a member 0.002 tokens short of its target
    (above pop_due's tolerance) finishes in ~2e-5 s, which rounds to "now": the engine
    re-armed its wake-up for the same instant forever (seen with switch_s=1e12)."""
    eng = EngineSim(0, 0, 1, COST, COST.kv_capacity_tokens(1))
    eng.queue, eng.eid, eng.wake_callbacks = [], itertools.count(), ()
    now = 1e12
    eng.updated = eng.stall_end = now
    eng.join(now, "a", 100, 0, 42)
    eng.progress = 42 - 0.002  # (where a run's accumulated rounding left it)
    done: list = []
    for _ in range(10):
        eng.rearm(now)
        now, *_ = heapq.heappop(eng.queue)
        eng.wake_at = float("inf")
        done += eng.pop_due(now)
        if done:
            break
    assert done == ["a"]
    assert now > 1e12


# 1 s per decode step from the weights, plus a KV term ~1e-7 of it: a member joining
# slows the batch by about that much (valid under the cost model's ranges).
FINE = CostModel(
    params=0.5e9, layers=1, d_model=1, kv_heads=1, head_dim=1, bytes_per_param=2.0,
    kv_bytes_per_elem=0.0625, hbm_bytes=10e9, hbm_bw=1e9, peak_flops=1e19, gpu_mem_util=0.9,
    decode_bw_eff=1.0, decode_compute_eff=1.0, decode_overhead_s=0.0, prefill_eff=1.0,
    train_mfu=1.0, max_num_seqs=256, sync_bw=1e16, sync_latency_s=0.0, kv_transfer_bw=1e16,
    switch_s=1.0, optimizer_step_s=0.0,
)


def test_engine_never_ends_a_turn_early():
    """A wake-up armed before another member slowed the batch fires early; pop_due took
    any member within 1e-6 * (1 + target) tokens of its target as done -- microseconds
    early at 1 s per token, enough to finish a run below its lower bound."""
    eng = EngineSim(0, 0, 1, FINE, FINE.kv_capacity_tokens(1))
    eng.queue, eng.eid, eng.wake_callbacks = [], itertools.count(), ()
    eng.join(0.0, "a", 0, 0, 3)
    eng.rearm(0.0)  # wake at t=3 for "a" at the batch-of-one rate
    eng.join(0.0, "b", 0, 800, 10)  # prefill stall, then every step ~1e-7 slower
    a_ends = eng.stall_end + 3 / eng.rate
    done: list = []
    for _ in range(10):
        now, *_ = heapq.heappop(eng.queue)
        eng.wake_at = float("inf")
        done += eng.pop_due(now)
        if done:
            break
        eng.rearm(now)
    assert done == ["a"]
    assert now >= a_ends * (1 - 1e-12)


def test_run_is_never_below_its_lower_bound_by_rounding():
    rows = [("t0", "T0", 0, 0, 3, 0.0), ("t1", "T1", 0, 334, 3, 0.0), ("t2", "T2", 0, 0, 0, 0.0)]
    w = Workload.from_frame(pd.DataFrame(rows, columns=COLUMNS))
    out = simulate(w, [[(t, t) for t in ("T0", "T1", "T2")]],
                   make_policy("async:rollout_fraction=0.5,staleness=0"),
                   RunConfig(gpus=2, tp=1, steps=1, check=True), FINE)
    assert out.result.makespan >= out.lower_bound_seconds * (1 - 1e-12)


def test_held_split_grown_and_consolidated_in_one_decision_sends_no_gpu_twice():
    """The last step's optimizer step ends after the run's rollout is over: ``hold`` grows
    the trainer by an engine and consolidation, in the same decision, releases every engine
    left. The view still lists the first as rolling out; it must not be sent again (found
    by the property below in CI: 'Reassign of GPU 4, which is already switching')."""
    spec = ("elastic:tail=0.0,pack=1.0,kv_limit=0.01,min_engines=1,drain=migrate,"
            "staleness=1,train_share=0.25,micro=1")
    w, batches = synthetic(7, 1, steps=2, seed=0)
    out = sim(w, batches, spec, gpus=8, tp=2, cost=replace(COST, switch_s=8.0))
    trained = [t for t in out.result.state.trajs.values() if t.status is TrajStatus.TRAINED]
    assert len(trained) == sum(len(b) for b in batches)


@st.composite
def elastic_setups(draw):
    spec = ",".join([
        f"tail={draw(st.sampled_from([0.0, 0.3, 0.5, 1.0]))}",
        f"pack={draw(st.sampled_from([0.1, 1.0, 64.0]))}",
        f"kv_limit={draw(st.sampled_from([0.01, 0.25, 1.0]))}",
        f"min_engines={draw(st.sampled_from([1, 2, 3, 4, 4096]))}",
        f"drain={draw(st.sampled_from(['migrate', 'finish_turn', 'interrupt']))}",
        f"staleness={draw(st.integers(0, 2))}",
        f"train_share={draw(st.sampled_from([0.0, 0.25, 0.95]))}",
        f"micro={draw(st.sampled_from([1, 2, 4096]))}",
    ])
    gpus, tp = draw(st.sampled_from([(8, 4), (8, 2), (16, 4), (4, 1), (2, 1)]))
    switch_s = draw(st.sampled_from([0.0, 8.0, 86_400.0]))
    n_traj = draw(st.integers(1, 8))
    turns = draw(st.integers(1, 4))
    steps = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 3))
    return f"elastic:{spec}", gpus, tp, switch_s, n_traj, turns, steps, seed


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=elastic_setups())
def test_elastic_always_finishes(setup):
    """Over elastic's parameter space, edges included, every run trains every step within
    its event budget (no stall, no livelock) and respects its lower bound."""
    spec, gpus, tp, switch_s, n_traj, turns, steps, seed = setup
    w, batches = synthetic(n_traj, turns, steps=steps, seed=seed)
    sim(w, batches, spec, gpus=gpus, tp=tp, cost=replace(COST, switch_s=switch_s))


# ------------------------------------------------- 3. processor with partial rollout
def fork_outlives_parent() -> Workload:
    """F forks P at turn 2; P's first tool call takes 50 s, so when F has finished
    (finish_fraction=0.5) P is interrupted with 1 kept turn: fewer than F shares with it."""
    rows = [("A", "P", k, 1, 1, 50.0 if k == 0 else 0.0) for k in range(4)]
    rows += [("A", "F", k, 1, 3 if k == 2 else 1, 0.0) for k in range(4)]
    df = pd.DataFrame(rows, columns=COLUMNS)
    df["parent_trajectory_id"] = [None] * 4 + ["P"] * 4
    df["branch_turn"] = [None] * 4 + [2] * 4
    return Workload.from_frame(df)


@pytest.mark.parametrize("mode", ["train", "drop", "resume"])
def test_processor_with_partial_rollout(mode):
    w = fork_outlives_parent()
    out = sim(w, [[("P", "P"), ("F", "F")]], f"partial:finish_fraction=0.5,mode={mode}",
              gpus=2, tp=1, processor=True)
    st_, trajs = out.result.state, out.result.trajs
    assert st_.trajs["F"].status is TrajStatus.TRAINED and trajs["F"].charged == 10
    p = st_.trajs["P"]
    if mode == "train":  # P's one kept turn is a prefix of F's path: merged, charged 0
        assert p.status is TrajStatus.TRAINED and p.turns_done == 1 and trajs["P"].charged == 0
    elif mode == "drop":
        assert p.status is TrajStatus.DROPPED and p.turns_done == 1
    else:  # resumed and trained whole (last step: nothing interrupted)
        assert p.status is TrajStatus.TRAINED and p.turns_done == 4


@pytest.mark.parametrize("mode", ["train", "drop"])
def test_processor_with_partial_rollout_on_the_sample_trace(mode):
    df = load_trace(sample_trace_path())
    w = Workload.from_frame(df)
    out = simulate(w, draw_batches(df, 4), make_policy(f"partial:finish_fraction=0.5,mode={mode}"),
                   RunConfig(gpus=16, tp=4, steps=4, processor=True, sandbox_slots=8), COST)
    assert out.result.complete and out.result.state.version == 4


# ------------------------------------- 4. a tool call runs on past an interrupt
# A trajectory interrupted (keeping progress) during a tool call was resumed without the
# rest of that call -- its next turn's prompt is the call's output -- so elastic with
# drain=interrupt finished below its lower bound, and the bound for deferring policies
# (partial) had been weakened to count no tool time at all. The live driver lets the call
# run on and resumes the trajectory when it returns; the simulator must do the same.


def tool_interrupted() -> Workload:
    """B's 100 s tool call is in flight when A finishes and elastic (pack=4) releases the
    engine B is on; C and D decode for ~55 s on the other engine."""
    rows = [("a", "A", 0, 10, 10, 0.0), ("b", "B", 0, 10, 10, 100.0), ("b", "B", 1, 10, 10, 0.0),
            ("c", "C", 0, 10, 2000, 0.0), ("d", "D", 0, 10, 2000, 0.0)]
    return Workload.from_frame(pd.DataFrame(rows, columns=COLUMNS))


def test_elastic_interrupt_drain_keeps_the_tool_call():
    w = tool_interrupted()
    out = simulate(w, [[(t, t) for t in "ACBD"]], make_policy("elastic:drain=interrupt,tail=1.0,pack=4"),
                   RunConfig(gpus=2, tp=1, steps=1, check=True), COST)
    b = out.result.state.trajs["B"]
    assert b.dispatches == 2  # interrupted with the engine, resumed on the other one
    assert b.finish_time >= COST.switch_s + 100.0
    assert out.result.makespan >= out.lower_bound_seconds - 1e-6


def partial_cut_in_tool_time() -> tuple[Workload, list[list[tuple[str, str]]]]:
    """T2's 100 s tool call is in flight when partial's 3 s budget cuts step 0."""
    rows = [("task0", "T0", 0, 10, 10, 0.0), ("task1", "T1", 0, 10, 10, 0.0),
            ("task2", "T2", 0, 10, 10, 100.0), ("task2", "T2", 1, 10, 10, 0.0)]
    w = Workload.from_frame(pd.DataFrame(rows, columns=COLUMNS))
    return w, [[("T0", "T0"), ("T2", "T2")], [("T1", "T1")]]


def run_partial_cut() -> SimOutcome:
    w, batches = partial_cut_in_tool_time()
    return simulate(w, batches, make_policy("partial:finish_fraction=1.0,budget_s=3"),
                    RunConfig(gpus=2, tp=1, steps=2, sandbox_slots=1, check=True), COST)


def test_partial_resume_waits_for_the_tool_call():
    out = run_partial_cut()
    t2 = out.result.state.trajs["T2"]
    assert t2.dispatches == 2 and t2.turns_done == 2
    assert t2.finish_time >= COST.switch_s + 100.0


def test_partial_lower_bound_counts_tool_time():
    out = run_partial_cut()
    assert out.lower_bound_seconds >= COST.switch_s + 100.0
    assert out.result.makespan >= out.lower_bound_seconds - 1e-6
