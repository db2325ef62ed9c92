"""Elastic on traces with no length spread (the ``uniform`` preset) under the default
preset's costs: every trajectory of a step ends within a second of the first, so the tail
moves nothing worth its KV transfer."""

from __future__ import annotations

import pytest

from rlsched.cluster.config import RunConfig
from rlsched.policies import make_policy
from rlsched.sim.presets import default_cost
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload
from rlsched.traces import draw_batches, generate_trace


@pytest.mark.parametrize("case", [(944570, 8, 4, 2, 24, 4), (140891, 4, 8, 2, 24, 8)])
def test_elastic_moves_nothing_about_to_end_on_a_trace_with_no_length_spread(case) -> None:
    """With the default preset's KV transfer costs, on a ``uniform`` trace (every
    trajectory of a step ends within a second of the first), isolating the tail moved
    trajectories predicted to run as long again -- they were at the one length every
    finished one had ended at -- and the engines they moved to were then released to the
    trainer: elastic was 14.1% behind colocated on both (250.3 vs 219.4 s; 501.8 vs
    439.9 s)."""
    seed, tasks, samples, tp, gpus, steps = case
    df = generate_trace("uniform", seed=seed, tasks=tasks * steps, samples=samples, turns_scale=0.3)
    w, b = Workload.from_frame(df), draw_batches(df, steps, tasks)
    cfg = RunConfig(gpus=gpus, tp=tp, steps=steps)
    cost = default_cost()
    col = simulate(w, b, make_policy("colocated"), cfg, cost).result.makespan
    el = simulate(w, b, make_policy("elastic"), cfg, cost).result.makespan
    assert el <= 1.01 * col, (el, col)


def test_the_rest_of_a_step_trains_as_one_micro_batch_once_the_trainer_holds_all_it_will_get():
    """With the whole step finished at once and every GPU in the trainer, elastic trained it
    in micro-batches of one trajectory per GPU, each paying a gradient reduction: 4.6%
    behind colocated, which trains a step as one job (310.2 vs 296.6 s)."""
    df = generate_trace("uniform", seed=467317, tasks=16 * 8, samples=8, turns_scale=0.1)
    w, b = Workload.from_frame(df), draw_batches(df, 8, 16)
    cfg = RunConfig(gpus=32, tp=2, steps=8)
    cost = default_cost()
    col = simulate(w, b, make_policy("colocated"), cfg, cost).result.makespan
    el = simulate(w, b, make_policy("elastic"), cfg, cost).result.makespan
    assert el <= 1.001 * col, (el, col)


def test_a_held_split_trains_what_is_ready_in_one_micro_batch():
    """Holding async's own split (16 of 32 GPUs training), staleness-1 elastic still trained
    in micro-batches of one trajectory per GPU, a gradient reduction each, for a trainer no
    GPU could join: 172.4 s against the best async's 145.0 s (18.9% behind); now 161.2 s.
    Pinned at its measured gap (a known one, in the README): what is left is the first
    step's moves, made before anything was measured, and the switches into the held split."""
    df = generate_trace("uniform", seed=467317, tasks=16 * 8, samples=8, turns_scale=0.1)
    w, b = Workload.from_frame(df), draw_batches(df, 8, 16)
    cfg = RunConfig(gpus=32, tp=2, steps=8)
    cost = default_cost()
    best = min(simulate(w, b, make_policy(f"async:rollout_fraction={f},staleness=1"), cfg, cost).result.makespan
               for f in (0.25, 0.375, 0.5, 0.625, 0.75))
    el = simulate(w, b, make_policy("elastic:staleness=1"), cfg, cost).result.makespan
    assert el <= 1.115 * best, (el, best)
