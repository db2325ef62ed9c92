"""Trainer -> engine weight transfer through Ray's object store.

Why the object store: the trainer exports one state dict per optimizer step; every engine
that syncs needs the same tensors. ``ray.put`` stores them once (shared memory on one
node, pulled once per node otherwise) and each engine's ``update_weights`` receives them
by reference, so N engines cost one export and one copy per node, not N pickles through
the driver. The version travels with the tensors so an engine always reports the version
of the weights it actually holds.

Names: the trainer exports Hugging Face Llama names (``model.layers.{i}.self_attn.q_proj
.weight`` ...), which is exactly what vLLM's ``LlamaForCausalLM.load_weights`` consumes (it
fuses q/k/v and gate/up itself). :func:`to_vllm_names` only drops what vLLM does not hold:
rotary ``inv_freq`` buffers and, for tied embeddings, ``lm_head.weight``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rlsched.cluster.errors import InvariantViolation

_SKIP_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


def to_vllm_names(hf_state: Mapping[str, Any], *, tied: bool = False) -> dict[str, Any]:
    """The trainer's HF-named CPU tensors as vLLM's loader expects them."""
    if not hf_state:
        raise InvariantViolation("weights: the trainer exported an empty state dict")
    out: dict[str, Any] = {}
    for name, tensor in hf_state.items():
        if name.endswith(_SKIP_SUFFIXES) or (tied and name == "lm_head.weight"):
            continue
        out[name] = tensor.detach().to("cpu").contiguous() if hasattr(tensor, "detach") else tensor
    if "model.embed_tokens.weight" not in out:
        raise InvariantViolation("weights: export has no model.embed_tokens.weight; not HF Llama names")
    return out


@dataclass(frozen=True)
class Published:
    """One version of the weights in the object store."""

    version: int
    ref: Any  # ray.ObjectRef of dict[str, torch.Tensor]
    nbytes: int
    put_seconds: float


class WeightStore:
    """Holds the newest published weights; engines started later load them too."""

    def __init__(self, *, tied: bool = False) -> None:
        self.tied = tied
        self.current: Published | None = None

    def publish(self, hf_state: Mapping[str, Any], version: int) -> Published:
        import ray

        t0 = time.perf_counter()
        named = to_vllm_names(hf_state, tied=self.tied)
        nbytes = sum(int(t.numel() * t.element_size()) for t in named.values() if hasattr(t, "numel"))
        ref = ray.put(named)
        self.current = Published(version, ref, nbytes, time.perf_counter() - t0)
        return self.current

    def send(self, actors: Iterable[Any]) -> list[Any]:
        """Start ``update_weights`` on each engine actor; returns their object refs."""
        if self.current is None:
            raise InvariantViolation("weights: send before any version was published")
        cur = self.current
        return [a.update_weights.remote(cur.ref, cur.version) for a in actors]
