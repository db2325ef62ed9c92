"""Elastic on traces with no length spread (the ``uniform`` preset) under the default
preset's costs (the do-no-harm test uses the flat model): every trajectory of a step ends
within a second of the first, so nothing is gained by moving the tail, by streaming
training in small micro-batches, or by holding an engine back from the trainer. Each case
below was found by a random sample of small clusters and is pinned at what it measures."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rlsched.cluster.config import RunConfig
from rlsched.policies import make_policy
from rlsched.sim.presets import default_cost
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload
from rlsched.traces import draw_batches, generate_trace

FRACTIONS = (0.25, 0.375, 0.5, 0.625, 0.75)


def _uniform(seed: int, tasks: int, samples: int, tp: int, gpus: int, steps: int,
             turns_scale: float) -> Callable[[str], float]:
    """Seconds of a policy spec on a ``uniform`` trace of ``steps`` steps of ``tasks`` x
    ``samples`` trajectories, on ``gpus`` GPUs of ``tp``, with the default preset."""
    df = generate_trace("uniform", seed=seed, tasks=tasks * steps, samples=samples, turns_scale=turns_scale)
    w, b = Workload.from_frame(df), draw_batches(df, steps, tasks)
    cfg = RunConfig(gpus=gpus, tp=tp, steps=steps)
    cost = default_cost()
    return lambda spec: simulate(w, b, make_policy(spec), cfg, cost).result.makespan


@pytest.mark.parametrize("case", [(944570, 8, 4, 2, 24, 4), (140891, 4, 8, 2, 24, 8)])
def test_elastic_moves_nothing_about_to_end_on_a_trace_with_no_length_spread(case) -> None:
    """With the default preset's KV transfer costs, isolating the tail moved trajectories
    predicted to run as long again -- they were at the one length every finished one had
    ended at -- and the engines they moved to were then released to the trainer: elastic
    was 14.1% behind colocated on both (250.3 vs 219.4 s; 501.8 vs 439.9 s)."""
    seconds = _uniform(*case, turns_scale=0.3)
    assert seconds("elastic") <= 1.01 * seconds("colocated")


def test_the_rest_of_a_step_trains_as_one_micro_batch_once_the_trainer_holds_all_it_will_get():
    """With the whole step finished at once and every GPU in the trainer, elastic trained it
    in micro-batches of one trajectory per GPU, each paying a gradient reduction: 4.6%
    behind colocated, which trains a step as one job (310.2 vs 296.6 s)."""
    seconds = _uniform(467317, 16, 8, 2, 32, 8, turns_scale=0.1)
    assert seconds("elastic") <= 1.001 * seconds("colocated")


def test_a_held_split_trains_what_is_ready_in_one_micro_batch():
    """Holding async's own split (16 of 32 GPUs training), staleness-1 elastic still trained
    in micro-batches of one trajectory per GPU, a gradient reduction each, for a trainer no
    GPU could join: 172.4 s against the best async's 145.0 s (18.9% behind); now 161.2 s.
    Pinned at its measured gap (a known one, in the README): what is left is the first
    step's moves, made before anything was measured, and the switches into the held split."""
    seconds = _uniform(467317, 16, 8, 2, 32, 8, turns_scale=0.1)
    best = min(seconds(f"async:rollout_fraction={f},staleness=1") for f in FRACTIONS)
    assert seconds("elastic:staleness=1") <= 1.115 * best


def test_gpus_on_their_way_count_toward_the_trainers_floor() -> None:
    """Two of three engines (tp 4) emptied together and went to the trainer (its floor: 8
    GPUs); the third emptied 0.26 s later and was held back -- 'the engines free now cannot
    lift it to its floor' -- as if the two were not on their way, then switched only once
    they had arrived: a second switch on every step's critical path, 8.3% behind colocated
    (208.7 vs 192.7 s). It now follows them at once."""
    seconds = _uniform(320676, 4, 4, 4, 12, 4, turns_scale=0.3)
    assert seconds("elastic") <= 1.01 * seconds("colocated")
