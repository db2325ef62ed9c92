"""The tiny model and the vLLM engine actor: it loads offline, generates, and a turn
aborted mid-generation hands back exactly the tokens it had produced."""

from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.live


def test_tiny_model_is_a_hf_llama_checkpoint(tiny_model, tiny_cache) -> None:
    from rlsched.real.model.tiny import SPECIAL_TOKENS, resolve_model
    from rlsched.real.rollout.agent_loop import Codec

    cfg = json.loads((tiny_model / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 32  # a vLLM-CPU head size
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (tiny_model / name).is_file(), name
    codec = Codec(tiny_model)
    text = "RUN: python -m pytest -q\ndef clamp(x, lo, hi):\n    return max(lo, min(hi, x))\n"
    assert codec.decode(codec.encode(text)) == text
    assert codec.eos_id == codec.tok.token_to_id(SPECIAL_TOKENS[2])
    t0 = time.perf_counter()
    assert resolve_model(None, tiny_cache, seed=0) == tiny_model  # cached: not rebuilt
    assert time.perf_counter() - t0 < 1.0


def test_chat_format_comes_from_the_template(tiny_model) -> None:
    from rlsched.real.rollout.agent_loop import ChatFormat

    fmt = ChatFormat.from_model_dir(tiny_model)
    assert fmt.first("hi") == "<|bos|><|user|>\nhi<|end|>\n<|assistant|>\n"
    assert fmt.observation("out", ended_with_eos=False) == "<|end|>\n<|user|>\nout<|end|>\n<|assistant|>\n"


def test_bad_checkpoint_paths_are_one_line(tmp_path) -> None:
    from rlsched.cluster.errors import LiveBackendError
    from rlsched.real.model.tiny import resolve_model

    with pytest.raises(LiveBackendError, match="not a directory"):
        resolve_model(tmp_path / "nope", tmp_path)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{not json")
    with pytest.raises(LiveBackendError, match="unreadable checkpoint config") as err:
        resolve_model(tmp_path / "ckpt", tmp_path)
    assert "\n" not in str(err.value)
    (tmp_path / "ckpt" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    with pytest.raises(LiveBackendError, match=r"no \*\.safetensors"):
        resolve_model(tmp_path / "ckpt", tmp_path)


def test_engine_generates_a_batch(engine) -> None:
    import ray

    assert engine.info["kv_capacity"] > 0 and engine.info["version"] == 0
    prompts = [engine.prompt(f"Task: fix function number {i}") for i in range(8)]
    out = ray.get(engine.actor.generate.remote(prompts, 32, temperature=0.0))
    assert len(out["token_ids"]) == 8
    assert all(0 < len(ids) <= 32 for ids in out["token_ids"])
    again = ray.get(engine.actor.generate.remote(prompts[:1], 32, temperature=0.0))
    assert again["token_ids"][0] == out["token_ids"][0]  # greedy is deterministic
    print(f"\nbatch of 8 x 32 tokens: {out['tokens'] / out['seconds']:.0f} tokens/s")


def test_abort_returns_the_tokens_generated_so_far(engine) -> None:
    import ray

    from rlsched.real.rollout.engine import TurnRequest

    prompt = engine.prompt("Task: a long answer")
    full = ray.get(engine.actor.generate.remote([prompt], 64, temperature=0.0))["token_ids"][0]
    rep = ray.get(engine.actor.step.remote([TurnRequest("r1", prompt, 64, 0.0)], [], 0.0))
    while not rep.outputs and rep.tokens == 0:
        rep = ray.get(engine.actor.step.remote([], [], 0.0))
    rep = ray.get(engine.actor.step.remote([], ["r1"], 0.0))
    (aborted,) = [o for o in rep.outputs if o.rid == "r1"]
    assert not aborted.finished
    assert 0 < len(aborted.token_ids) < len(full)
    assert aborted.token_ids == full[: len(aborted.token_ids)]
    # Continuing from the kept tokens (a migration re-prefills them) finishes the same text.
    rest = ray.get(engine.actor.generate.remote([prompt + aborted.token_ids], 64 - len(aborted.token_ids),
                                                temperature=0.0))["token_ids"][0]
    assert aborted.token_ids + rest == full


def test_a_turn_submitted_during_a_step_joins_the_running_batch(engine) -> None:
    """Issue #11: a turn handed to the engine while a ``step`` call runs (its tool call
    returned) is generated alongside the running turns, not after that call ends."""
    import ray

    from rlsched.real.rollout.engine import INBOX, TurnRequest

    # no stop ids (the engine has no tokenizer, so no EOS stop): each turn runs to its cap
    running = engine.actor.step.remote([TurnRequest("long", engine.prompt("Task: long"), 96, 0.0)], [], 30.0)
    ray.get(engine.actor.submit.options(concurrency_group=INBOX).remote(
        [TurnRequest("short", engine.prompt("Task: short"), 8, 0.0)], []))
    rep = ray.get(running, timeout=120)
    # the call ended when the short turn finished, with the long one still generating
    assert [(o.rid, o.finished, len(o.token_ids)) for o in rep.outputs] == [("short", True, 8)]
    assert rep.running == 1
    assert rep.batched >= rep.iterations + 7  # at least 8 iterations ran both turns
    while True:
        rep = ray.get(engine.actor.step.remote([], [], 30.0), timeout=120)
        if rep.outputs:
            break
    assert [(o.rid, o.finished, len(o.token_ids)) for o in rep.outputs] == [("long", True, 96)]


def test_a_slot_holds_one_worker(engine) -> None:
    import ray

    from rlsched.cluster.errors import LiveBackendError
    from rlsched.real.loop.ray_cluster import free_slots, slots_options, wait_ready
    from rlsched.real.rollout.engine import engine_actor_class

    assert engine.SLOT not in free_slots(engine.cluster)
    second = engine_actor_class().options(**slots_options([engine.SLOT])).remote(engine.settings, engine_id=1)
    with pytest.raises(LiveBackendError, match="did not start within"):
        wait_ready(second.info.remote(), "engine 1", [engine.SLOT], 3)
    ray.kill(second)
