"""The live trajectory processor (``[run] processor = true``; ``real/train/prefix_tree.py``):
a group's shared prefixes run once through the real megatron-core trainer, packed as a
prefix tree, and it trains exactly what separate sequences train -- the same logits at
every sample token, the same loss and gradient up to rounding -- on fewer forward tokens.
Then a live run with the processor on trains the same trajectories with the same loss as
one with it off, charging fewer tokens.
"""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.live


PROMPT = list(range(5, 17))


def _samples():
    from rlsched.real.train.grpo import Sample

    def gen(suffix, adv, group="g", stale=False):
        toks = (PROMPT if group == "g" else [7, 8]) + suffix
        mask = [0] * (len(toks) - len(suffix)) + [1] * len(suffix)
        if not stale:
            return Sample(toks, mask, adv, group)
        # generated one version ago: behaviour log-probabilities recorded per generated token
        lps = [math.nan if not m else -1.5 - 0.1 * i for i, m in enumerate(mask)]
        return Sample(toks, mask, adv, group, behaviour_logprobs=lps, staleness=list(mask))

    return [gen([40, 41, 42, 43], 1.0), gen([40, 41, 50], -0.5), gen([60, 61, 62, 63, 64], 0.7, stale=True),
            gen([40, 41, 42, 43], 1.0),  # a duplicate path
            gen([40, 41], -1.2),  # a path another one subsumes
            gen([9, 10, 11], 0.3, "h"), gen([20], -0.3, "h")]


def test_packed_logits_are_the_unpacked_logits(tiny_model) -> None:
    import torch

    from rlsched.real.train.megatron_cpu import apply_cpu_workarounds, init_single_process_megatron
    from rlsched.real.train.megatron_model import build_gpt_model, gpt_logits, read_hf_config
    from rlsched.real.train.pg_loss import collate
    from rlsched.real.train.prefix_tree import tree_logits, tree_mask

    apply_cpu_workarounds()
    init_single_process_megatron()
    torch.manual_seed(0)
    model = build_gpt_model(read_hf_config(tiny_model))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    model.eval()
    samples = _samples()
    tokens, _mask, _ = collate(samples)
    with torch.no_grad():
        plain = gpt_logits(model, tokens)
        packed = tree_logits(model, [s.token_ids for s in samples], [s.group for s in samples], tokens.shape[1])
    for row, s in enumerate(samples):
        n = len(s.token_ids)
        torch.testing.assert_close(packed[row, :n], plain[row, :n], rtol=1e-4, atol=1e-5)
    # the mask: a node sees itself and its ancestors only
    m = tree_mask([-1, 0, 1, 0])[0, 0]
    assert (~m).tolist() == [[True, False, False, False], [True, True, False, False],
                             [True, True, True, False], [True, False, False, True]]


def test_the_processor_trains_what_separate_sequences_train(tiny_model) -> None:
    import torch

    from rlsched.real.train.prefix_tree import charged_tokens
    from rlsched.real.train.worker import TrainWorker

    samples = _samples()
    plain = TrainWorker(str(tiny_model), seed=0, lr=1e-2)
    packed = TrainWorker(str(tiny_model), seed=0, lr=1e-2, processor=True)
    a, b = plain.forward_backward(samples), packed.forward_backward(samples)
    assert b["trained_tokens"] == a["trained_tokens"] and b["tokens"] == a["tokens"]
    assert b["loss_sum"] == pytest.approx(a["loss_sum"], rel=1e-5, abs=1e-6)
    assert b["stale_tokens"] == a["stale_tokens"] == 5 and b["ratio_sum"] == pytest.approx(a["ratio_sum"], rel=1e-5)
    packed_len = sum(charged_tokens([s.token_ids for s in samples], [s.group for s in samples]))
    assert b["forward_tokens"] == packed_len == 12 + 4 + 1 + 5 + 2 + 3 + 1  # the prompt once per group
    assert a["forward_tokens"] == a["tokens"] > 2 * packed_len
    for ga, gb in zip(plain._grads(), packed._grads(), strict=True):
        torch.testing.assert_close(gb, ga, rtol=1e-4, atol=1e-5)  # fp32 sums in another order
    plain.optimizer_step()
    packed.optimizer_step()
    assert packed.loss(samples) == pytest.approx(plain.loss(samples), rel=1e-4, abs=1e-6)


TINY = {  # 2 tasks x 2 samples, 2 turns of at most 16 tokens
    "tasks": ["fix-clamp", "fix-last-item"], "tasks_per_step": 2, "samples_per_task": 2,
    "max_turns": 2, "max_tokens_per_turn": 16, "kv_cache_mb": 64, "tool_seconds": 5.0,
    "max_wall_s": 900.0,
}


def test_a_live_run_with_the_processor_trains_the_same_on_fewer_tokens(tiny_cache, tmp_path) -> None:

    from rlsched.cluster.config import RunConfig
    from rlsched.cluster.record import read_run
    from rlsched.policies import make_policy_and_spec
    from rlsched.real.run import run_live

    recs = {}
    for on in (False, True):
        config = {"run": RunConfig(gpus=2, tp=1, steps=1, processor=on),
                  "live": {**TINY, "cache_dir": str(tiny_cache)}}
        out = run_live("colocated", make=make_policy_and_spec, steps=1, out_dir=tmp_path / f"p{int(on)}",
                       config=config, seed=0)
        recs[on] = read_run(out)
    off, on = recs[False], recs[True]
    assert on.meta["complete"] and on.meta["config"]["processor"] is True
    tr_off = off.trajectories.set_index("trajectory")
    tr_on = on.trajectories.set_index("trajectory")
    assert sorted(tr_on.index) == sorted(tr_off.index) and set(tr_on["status"]) == {"trained"}
    s_off, s_on = off.steps, on.steps
    assert s_on["loss"].iloc[0] == pytest.approx(s_off["loss"].iloc[0], rel=1e-4, abs=1e-6)
    # a task's samples share at least its prompt: charged once with the processor
    assert s_on["trained_tokens"].iloc[0] < s_off["trained_tokens"].iloc[0]
    mb = on.meta["measurements"]["micro_batches"]
    assert sum(x["forward_tokens"] for x in mb) == s_on["trained_tokens"].iloc[0]
