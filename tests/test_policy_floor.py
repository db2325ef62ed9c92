"""Every shipped policy runs where the trainer has a memory floor: the reference-scale MoE
preset (a 512-GPU floor at 700k-token sequences) on 1024 GPUs. ``elastic`` with staleness
once started a 256-GPU trainer (its ``train_share``) that could never run, and stalled."""

from __future__ import annotations

import pytest

from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import PolicyError
from rlsched.cluster.faults import Fault, FaultSchedule
from rlsched.policies import make_policy
from rlsched.sim.memory import min_engine_gpus, train_layout
from rlsched.sim.presets import default_cost, preset_cost, with_seq
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload
from rlsched.traces import draw_batches, generate_trace, load_trace, sample_trace_path


@pytest.fixture(scope="module")
def reference_scale():
    cost = with_seq(preset_cost("ref-2.4t", "h200"), 700_000)
    df = generate_trace("longtail-small", seed=0, tasks=3 * 32, long_frac=0.35, tokens_scale=3.0,
                        max_context_tokens=1_000_000)
    return cost, Workload.from_frame(df), draw_batches(df, 3, 32)


@pytest.mark.parametrize("spec", ["elastic", "elastic:staleness=1", "colocated",
                                  "async:rollout_fraction=0.5,staleness=1", "partial"])
def test_policy_completes_above_the_trainer_floor(reference_scale, spec) -> None:
    cost, w, b = reference_scale
    assert train_layout(cost).min_gpus == 512
    tp = max(4, min_engine_gpus(cost))
    out = simulate(w, b, make_policy(spec), RunConfig(gpus=1024, tp=tp, steps=3, check=True), cost)
    assert out.result.complete and out.result.state.version == 3


# GPU, tool, trainer and sync faults at rates that hit a 16-GPU cluster several times in 4
# steps (the fingerprint's schedule): with the default preset's 8-GPU floor, elastic once
# rounded an emptied trainer down to whole engines (one GPU left below the floor), and then
# sent the GPU of an engine with a failed partner to IDLE after the rest had gone to ROLLOUT
# (checked while the rest were still TRAIN: below the floor); both were refused mid-run.
FLOOR_FAULTS = FaultSchedule(
    (Fault("gpu", per_hour=6.0), Fault("tool", per_hour=60.0), Fault("trainer", per_hour=3.0),
     Fault("sync", per_hour=6.0)),
    seed=3,
)


@pytest.mark.parametrize("processor", [False, True])
@pytest.mark.parametrize("spec", ["elastic", "elastic:staleness=1"])
def test_elastic_keeps_the_floor_under_gpu_failures(spec, processor) -> None:
    cost = default_cost()
    df = load_trace(sample_trace_path())
    cfg = RunConfig(gpus=16, tp=2, steps=4, tasks_per_step=8, check=True, faults=FLOOR_FAULTS,
                    processor=processor)
    assert train_layout(cost).min_gpus == 8
    out = simulate(Workload.from_frame(df), draw_batches(df, 4, 8), make_policy(spec), cfg, cost)
    assert out.result.complete and out.result.state.version == 4


# A cluster no larger than the trainer's floor and one engine: the default preset (an
# 8-GPU floor) on 8 GPUs of tp 4. Nothing can roll out while the trainer runs, so GPUs move
# between the roles wholesale, as colocated does.
@pytest.fixture(scope="module")
def floor_sized():
    cost = default_cost()
    df = load_trace(sample_trace_path())
    assert train_layout(cost).min_gpus == 8
    return cost, Workload.from_frame(df), draw_batches(df, 4)  # (16 tasks x 8 a step)


@pytest.mark.parametrize("spec", ["elastic:staleness=1", "elastic:staleness=2",
                                  "elastic:staleness=1,cut=0.25,cut_stop=true"])
def test_elastic_with_staleness_runs_where_the_trainer_needs_every_gpu(floor_sized, spec) -> None:
    """It kept one engine rolling out once nothing did (``min_engines``), so the trainer
    could never reach its floor: 'policy elastic stalled ... the trainer holds 0 GPUs,
    below its floor of 8'."""
    cost, w, b = floor_sized
    out = simulate(w, b, make_policy(spec), RunConfig(gpus=8, tp=4, steps=4, check=True), cost)
    assert out.result.complete and out.result.state.version == 4


def test_elastic_on_policy_is_colocated_where_the_trainer_needs_every_gpu(floor_sized) -> None:
    """No GPU can move while anything rolls out, so elastic's own placement buys nothing;
    pinned to engines, its trajectories were evicted and prefilled again where colocated's
    went back to the cluster's queue for any engine with free KV: 6.6% slower (shipped
    trace, 16 tasks a step). Elastic then dispatches to the cluster's queue too."""
    cost, w, b = floor_sized
    cfg = RunConfig(gpus=8, tp=4, steps=4)
    col = simulate(w, b, make_policy("colocated"), cfg, cost).result.makespan
    el = simulate(w, b, make_policy("elastic"), cfg, cost).result.makespan
    assert el <= 1.01 * col, (el, col)


def test_a_fixed_split_that_cannot_hold_the_trainer_is_refused_in_one_line(floor_sized) -> None:
    """async on 8 GPUs with an 8-GPU floor ran until it stalled (the trainer side of 4 GPUs
    could never train); it is now refused at its first decision, naming what it needs."""
    cost, w, b = floor_sized
    with pytest.raises(PolicyError, match=r"below its memory floor of 8 .*at least 12 GPUs"):
        simulate(w, b, make_policy("async:staleness=1"), RunConfig(gpus=8, tp=4, steps=4), cost)


@pytest.mark.parametrize("spec", ["elastic", "elastic:staleness=1", "colocated", "partial"])
def test_a_gpu_failure_on_a_cluster_of_the_trainers_floor_does_not_stall(floor_sized, spec) -> None:
    """8 GPUs, floor 8: a failed GPU left the trainer at 7 (it runs nothing below its floor)
    and, once the GPU was back, no rule sent it there -- elastic's return only whole engines
    to rollout, and colocated and partial looked again only on a rollout role change, so a
    recovery while other GPUs were switching to the trainer was missed: 'policy ... stalled
    ... the trainer holds 7 GPUs, below its floor of 8' (all four, fault seed 0)."""
    cost, w, _ = floor_sized
    faults = FaultSchedule((Fault("gpu", per_hour=6.0), Fault("tool", per_hour=60.0),
                            Fault("trainer", per_hour=3.0), Fault("sync", per_hour=6.0)), seed=0)
    b8 = draw_batches(load_trace(sample_trace_path()), 4, 8)
    out = simulate(w, b8, make_policy(spec), RunConfig(gpus=8, tp=4, steps=4, check=True, faults=faults), cost)
    assert out.result.complete and out.result.state.version == 4
