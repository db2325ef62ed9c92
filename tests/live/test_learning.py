"""Issue #25 -- live RL that learns, and the off-policy correction on real engines.

* the engine records, per generated token, vLLM's log-probability of it and the weights
  version that generated it, and they are the model's own (recomputed with transformers);
* on the ``lookup`` task (configs/live-learn.toml's settings, shortened), rewards vary
  within a GRPO group from the first step and the mean reward rises over a short seeded
  run by the margin stated below;
* under one-step-stale ``async`` training, stale tokens are weighted against their
  recorded behaviour log-probabilities;
* with staleness 0 every trained token is on-policy: behaviour weight exactly 1, nothing
  truncated or clipped;
* a colocated run's steps table carries the per-step learning figures (reward and its
  spread, loss, KL to the starting policy, token staleness, clip fraction, importance
  ratio), on-policy values exactly, and its report shows a Learning section.
"""

from __future__ import annotations

import json
import math

import pytest

pytestmark = pytest.mark.live

LEARN = {  # configs/live-learn.toml's [live] table
    "env": "lookup", "tasks_per_step": 4, "samples_per_task": 16, "max_turns": 3,
    "max_tokens_per_turn": 16, "max_observation_tokens": 64, "kv_cache_mb": 64, "tool_seconds": 5.0,
    "lr": 3e-4, "warm_start_steps": 150, "warm_start_lr": 3e-3, "warm_start_tool_share": 0.15,
    "max_wall_s": 1500.0,
}
STEPS = 20
# Stated margin: the mean reward of the last 4 steps is at least this much above the first
# 4 steps'. Measured live on the 2-core development machine, seed 0, this test's run
# (async k=0) at the config's lr 3e-4: first-4 mean 0.094, last-4 mean 0.391 (+0.297). At
# the earlier lr 1e-3 the same run gave 0.125 -> 0.926, but 1e-3 wrecked the policy for
# other seeds (seed 1: reward 0 from the second step on; issue #25), so the config trades
# speed for stability and the margin follows the slower rise.
MARGIN = 0.2


def test_engine_records_behaviour_logprobs_and_versions(engine) -> None:
    import ray
    import torch
    import transformers

    from rlsched.real.rollout.engine import TurnRequest

    prompt = engine.prompt("RUN: cp vault.txt answer.txt")
    req = TurnRequest("lp-0", prompt, 12, temperature=1.0, seed=5)
    outs = ray.get(engine.actor.step.remote([req], [], 60.0)).outputs
    while not outs:
        outs = ray.get(engine.actor.step.remote([], [], 60.0)).outputs
    (out,) = outs
    version = ray.get(engine.actor.get_version.remote())
    assert out.token_ids and len(out.logprobs) == len(out.token_ids) == len(out.versions)
    assert set(out.versions) == {version}
    model = transformers.LlamaForCausalLM.from_pretrained(engine.model_dir).eval()
    ids = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
    n = len(prompt)
    expect = [float(logp[n - 1 + i, t]) for i, t in enumerate(out.token_ids)]
    assert all(math.isfinite(x) and x <= 0 for x in out.logprobs)
    assert max(abs(a - b) for a, b in zip(out.logprobs, expect, strict=True)) < 2e-3, (out.logprobs, expect)


def _run(spec: str, steps: int, out, cache) -> tuple[object, dict]:
    from rlsched.cluster.config import RunConfig
    from rlsched.policies import make_policy_and_spec
    from rlsched.real.run import run_live

    config = {"run": RunConfig(gpus=2, tp=1, steps=steps), "live": {**LEARN, "cache_dir": str(cache)}}
    run_live(spec, make=make_policy_and_spec, steps=steps, out_dir=out, config=config, seed=0)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["complete"] and meta["steps_done"] == steps
    return out, meta


def _curve(out):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from learning_curve import curve

    return curve(out)


def test_lookup_rewards_vary_and_rise(tiny_cache, tmp_path) -> None:
    # async k=0: on-policy like colocated (whose 15-step run is the measured figure) on a
    # fixed split, so each step costs seconds here instead of colocated's engine restarts
    out, _ = _run("async:staleness=0", STEPS, tmp_path / "learn", tiny_cache)
    c = _curve(out)
    print("\n" + c[["step", "reward", "groups_varying", "turns"]].to_string(index=False))
    assert len(c) == STEPS and (c["trajectories"] == 64).all()
    assert c["groups_varying"].iloc[0] > 0, "rewards must vary within some group at the first step"
    first, last = c["reward"].head(4).mean(), c["reward"].tail(4).mean()
    assert first < 0.35, f"the warm-started policy should rarely read the file (first-4-step reward {first:.3f})"
    assert last >= first + MARGIN, f"mean reward {first:.3f} -> {last:.3f}: rose by less than {MARGIN}"


def test_stale_tokens_are_weighted_by_their_recorded_behaviour(tiny_cache, tmp_path) -> None:
    # A few steps only: in long runs the async policy was seen to train a multi-turn
    # trajectory two versions after it began under staleness=1 (a PolicyError from the
    # driver's check at step 17 -- a policy issue, reported, not covered here).
    _, meta = _run("async:staleness=1", 5, tmp_path / "stale", tiny_cache)
    batches = meta["measurements"]["micro_batches"]
    # from the second step on, tokens generated one version ago are trained, weighted by
    # their recorded behaviour log-probabilities (a finite log ratio, mostly untruncated)
    stale = [b for b in batches[1:] if b["stale_tokens"] > 0]
    assert stale, "async k=1 trained no stale token"
    import pandas as pd

    steps = pd.read_parquet(tmp_path / "stale" / "steps.parquet")
    # the steps table says the same per step: the first step trains version-0 tokens at
    # version 0, every later one what the engines generated one version behind
    assert steps["token_staleness_max"].iloc[0] == 0 and (steps["token_staleness_max"].iloc[1:] == 1).all()
    assert (steps["token_staleness_mean"].iloc[1:] > 0).all() and steps["token_staleness_mean"].max() <= 1
    later = steps.iloc[1:]
    assert (later["ratio_min"] > 0).all() and (later["ratio_max"] > later["ratio_min"]).all()  # real ratios, not 1
    assert all(b["max_token_staleness"] <= 1 and math.isfinite(b["stale_log_ratio_mean"]) for b in stale)
    assert max(b["truncated_fraction"] for b in batches) < 0.5
    assert any(b["mean_behaviour_weight"] != 1.0 for b in stale)  # the recorded behaviour acted


def test_on_policy_training_has_unit_ratio_and_no_clipping(tiny_cache, tmp_path) -> None:
    _, meta = _run("async:staleness=0", 3, tmp_path / "sync", tiny_cache)
    batches = meta["measurements"]["micro_batches"]
    assert batches and sum(b["trained_tokens"] for b in batches) > 0
    for b in batches:
        assert b["stale_tokens"] == 0 and b["max_token_staleness"] == 0
        assert b["mean_behaviour_weight"] == 1.0  # exactly: on-policy tokens are not reweighted
        assert b["truncated_fraction"] == 0.0 and b["clip_fraction"] == 0.0


def test_colocated_run_records_learning_figures_per_step(tiny_cache, tmp_path) -> None:
    import pandas as pd

    from rlsched.analysis.report import write_report
    from rlsched.real.train.learning_figures import LEARNING_COLUMNS

    out, meta = _run("colocated", 2, tmp_path / "colo", tiny_cache)
    steps = pd.read_parquet(out / "steps.parquet")
    assert list(steps.columns[-len(LEARNING_COLUMNS):]) == LEARNING_COLUMNS
    assert steps[LEARNING_COLUMNS].notna().all().all(), steps.to_string()
    assert ((steps["reward_mean"] >= 0) & (steps["reward_mean"] <= 1)).all()
    assert steps["groups_varying"].iloc[0] > 0 and steps["reward_group_std"].iloc[0] > 0
    # on-policy colocated: the importance ratio is exactly 1, nothing clipped, truncated or stale
    assert (steps["ratio_mean"] == 1.0).all() and (steps["ratio_min"] == 1.0).all() and (steps["ratio_max"] == 1.0).all()
    assert (steps["clip_fraction"] == 0.0).all() and (steps["truncated_fraction"] == 0.0).all()
    assert (steps["token_staleness_max"] == 0).all()
    # the first step trains the starting weights themselves: KL 0; after one update it is positive
    assert steps["kl_to_start"].iloc[0] == pytest.approx(0.0, abs=1e-6)
    assert steps["kl_to_start"].iloc[1] > 0
    # the loss column is the micro-batches' token-mean loss of the step
    b = meta["measurements"]["micro_batches"]
    first = [x for x in b if x["version"] == 0 and x["trained_tokens"]]
    expect = sum(x["loss"] * x["trained_tokens"] for x in first) / sum(x["trained_tokens"] for x in first)
    assert steps["loss"].iloc[0] == pytest.approx(expect, rel=1e-9)
    page = write_report([out], tmp_path / "report").read_text()
    assert "<h2>Learning</h2>" in page and (tmp_path / "report" / "learning.csv").is_file()


def test_kl_reference_changes_nothing_in_training(tiny_model) -> None:
    # in-process trainer ranks (no Ray): the frozen starting copy only adds figures
    from rlsched.real.train.grpo import Sample
    from rlsched.real.train.worker import TrainWorker

    samples = [Sample(list(range(5, 25)), [0] * 5 + [1] * 15, 1.0, "g", reward=1.0),
               Sample(list(range(30, 42)), [0] * 4 + [1] * 8, -1.0, "g", reward=0.0)]
    with_ref, without = TrainWorker(str(tiny_model), seed=0, lr=1e-2), TrainWorker(str(tiny_model), seed=0, lr=1e-2,
                                                                                     kl_reference=False)
    a, b = with_ref.forward_backward(samples), without.forward_backward(samples)
    assert a["loss_sum"] == b["loss_sum"] and a["kl_sum"] == 0.0 and "kl_sum" not in b  # version 0 is the start
    assert a["ratio_min"] == a["ratio_max"] == 1.0 and a["ratio_sum"] == a["trained_tokens"]
    with_ref.optimizer_step()
    without.optimizer_step()
    assert with_ref.digest() == without.digest()  # bit-identical weights and AdamW state
    assert with_ref.forward_backward(samples)["kl_sum"] > 0  # one update later the policy has moved
