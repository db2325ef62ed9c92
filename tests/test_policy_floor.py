"""Every shipped policy runs where the trainer has a memory floor: the reference-scale MoE
preset (a 512-GPU floor at 700k-token sequences) on 1024 GPUs. ``elastic`` with staleness
once started a 256-GPU trainer (its ``train_share``) that could never run, and stalled."""

from __future__ import annotations

import pytest

from rlsched.cluster.config import RunConfig
from rlsched.policies import make_policy
from rlsched.sim.memory import min_engine_gpus, train_layout
from rlsched.sim.presets import preset_cost, with_seq
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload
from rlsched.traces import draw_batches, generate_trace


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
