"""Weights move trainer -> engines through Ray's object store and change what the engine
generates; the version travels with them."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.live


def _weights(model_dir):
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def test_names_are_what_vllm_loads(tiny_model) -> None:
    import torch

    from rlsched.cluster.errors import InvariantViolation
    from rlsched.real.train.weights import to_vllm_names

    hf = _weights(tiny_model)
    hf["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    assert set(to_vllm_names(hf)) == set(hf) - {"model.layers.0.self_attn.rotary_emb.inv_freq"}
    assert "lm_head.weight" not in to_vllm_names(hf, tied=True)
    with pytest.raises(InvariantViolation):
        to_vllm_names({})


def test_weight_update_changes_greedy_output(engine) -> None:
    import ray
    import torch

    from rlsched.real.train.weights import WeightStore

    prompt = [engine.prompt("Task: fix clamp in numbers_util.py")]
    before = ray.get(engine.actor.generate.remote(prompt, 24, temperature=0.0))["token_ids"][0]
    original = _weights(engine.model_dir)
    gen = torch.Generator().manual_seed(7)
    other = {k: (v if k.endswith("norm.weight") else torch.randn(v.shape, generator=gen) * 0.02)
             for k, v in original.items()}
    store = WeightStore()
    pub = store.publish(other, version=1)
    (res,) = ray.get(store.send([engine.actor]))
    assert res["version"] == 1 and ray.get(engine.actor.get_version.remote()) == 1
    after = ray.get(engine.actor.generate.remote(prompt, 24, temperature=0.0))["token_ids"][0]
    assert after != before
    store.publish(original, version=2)
    ray.get(store.send([engine.actor]))
    restored = ray.get(engine.actor.generate.remote(prompt, 24, temperature=0.0))["token_ids"][0]
    assert restored == before  # the update is exact, not a perturbation of the old weights
    print(f"\nweight sync of {pub.nbytes} bytes: put {pub.put_seconds * 1e3:.0f} ms, "
          f"load {res['seconds'] * 1e3:.0f} ms")
