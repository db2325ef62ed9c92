"""Micro-benchmarks on a real vLLM engine: decode steps, prefill, weight reloads.

Why a subclass of :class:`~rlsched.real.rollout.engine.VllmEngine` and not its ``step`` API: the
cost model charges *one decode step* of a batch and *one prefill* of a request, and the
step API reports only whole slices of engine iterations. Here every ``LLMEngine.step``
is timed on its own, inside the actor, with the engine built exactly as a live run builds
it (same :class:`~rlsched.real.rollout.engine.EngineSettings`, so the same vLLM code path, KV
cache size, thread count and prefix caching). Prompts are random token ids drawn per call,
so no request hits the prefix cache unless a benchmark asks for it.
"""

from __future__ import annotations

import random
import time
from typing import Any

from rlsched.real.rollout.engine import EngineSettings, VllmEngine


class BenchEngine(VllmEngine):
    """A live engine plus timing methods (run as a Ray actor by :func:`bench_actor_class`)."""

    def __init__(self, settings: EngineSettings, *, engine_id: int = 0, version: int = 0) -> None:
        super().__init__(settings, engine_id=engine_id, version=version)
        cfg = self.core.vllm_config.model_config.hf_config
        self.vocab = int(getattr(cfg, "vocab_size", 1000))
        self._n = 0

    def _prompt(self, rng: random.Random, n: int) -> list[int]:
        # ids from 3 up: clear of the special tokens (pad/bos/eos) of the tiny tokenizer
        return [rng.randrange(3, self.vocab) for _ in range(n)]

    def _rid(self, tag: str) -> str:
        self._n += 1
        return f"bench-{tag}-{self._n}"

    def _sampling(self, tokens: int) -> Any:
        from vllm import SamplingParams

        return SamplingParams(n=1, temperature=0.0, max_tokens=tokens, ignore_eos=True,
                              detokenize=False)

    def bench_decode(self, batch: int, prompt_len: int, tokens: int, seed: int) -> list[dict]:
        """``batch`` requests of ``prompt_len`` fresh tokens each, ``tokens`` new tokens
        each; one row per pure decode step: its seconds, batch size and the batch's total
        context (prompt + generated so far, summed over running requests)."""
        rng = random.Random(seed)
        self.core.reset_prefix_cache()
        rids = [self._rid("d") for _ in range(batch)]
        for rid in rids:
            self.core.add_request(rid, {"prompt_token_ids": self._prompt(rng, prompt_len)},
                                  self._sampling(tokens))
        made = dict.fromkeys(rids, 0)
        rows: list[dict] = []
        while made:
            # a pure decode step: every running request already has its first token, so
            # none of them is (chunk-)prefilling in this step
            pure = all(n > 0 for n in made.values())
            running = len(made)
            context = sum(prompt_len + n for n in made.values())
            t0 = time.perf_counter()
            outs = self.core.step()
            secs = time.perf_counter() - t0
            for out in outs:
                if out.request_id not in made:
                    continue
                made[out.request_id] = len(out.outputs[0].token_ids)
                if out.finished:
                    del made[out.request_id]
            if pure:
                rows.append({"seconds": secs, "batch": running, "context": context})
        return rows

    def bench_prefill(self, new: int, cached: int, seed: int) -> dict:
        """One request of ``cached`` tokens already in the prefix cache (0: none) plus
        ``new`` fresh ones, generating one token. Returns its seconds and the cache hit
        vLLM reports (block-granular, so it may be below ``cached``)."""
        rng = random.Random(seed)
        self.core.reset_prefix_cache()
        prefix = self._prompt(rng, cached)
        if cached:
            rid = self._rid("warm")
            self.core.add_request(rid, {"prompt_token_ids": prefix}, self._sampling(1))
            while self.core.has_unfinished_requests():
                self.core.step()
        rid = self._rid("p")
        t0 = time.perf_counter()
        self.core.add_request(rid, {"prompt_token_ids": prefix + self._prompt(rng, new)},
                              self._sampling(1))
        hit = 0
        while self.core.has_unfinished_requests():
            for out in self.core.step():
                if out.request_id == rid and out.finished:
                    hit = int(getattr(out, "num_cached_tokens", 0) or 0)
        secs = time.perf_counter() - t0
        return {"seconds": secs, "new": cached + new - hit, "cached": hit}

    def kv_info(self) -> dict:
        cache = self.core.vllm_config.cache_config
        return {"kv_capacity": self.kv_capacity, "block_size": int(cache.block_size),
                "blocks": int(cache.num_gpu_blocks or 0)}


def bench_actor_class():  # -> ray.actor.ActorClass
    """:class:`BenchEngine` as a Ray actor, one call at a time (as the live engine)."""
    import ray

    return ray.remote(max_concurrency=1)(BenchEngine)
