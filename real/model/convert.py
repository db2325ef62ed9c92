"""Map HF Llama weights to megatron-core ``GPTModel`` (local spec) weights and back.

Why a mapping and not a rename: megatron fuses three HF matrices into one and two into
another, with its own row order.

* ``linear_qkv`` holds Q, K and V *per query group*: for each of the ``kv_heads`` groups,
  the group's ``heads / kv_heads`` query heads, then its key head, then its value head
  (each ``head_dim`` rows). HF stores ``q_proj``, ``k_proj``, ``v_proj`` separately.
* ``linear_fc1`` holds ``[gate_proj; up_proj]`` (megatron's gated linear unit applies the
  activation to the first half), HF stores them separately.

Rotary embeddings need no permutation: HF Llama and megatron (``rotary_interleaved``
false) both rotate the two halves of each head. The mapping is a pure reshuffle of rows,
so HF -> megatron -> HF is exact (tested bit for bit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from rlsched.cluster.errors import LiveBackendError


@dataclass(frozen=True)
class LlamaShape:
    """The sizes the mapping needs, read from a HF Llama ``config.json``."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int
    tied: bool

    @classmethod
    def from_hf_config(cls, config: Mapping) -> LlamaShape:
        try:
            heads = int(config["num_attention_heads"])
            hidden = int(config["hidden_size"])
            return cls(
                layers=int(config["num_hidden_layers"]),
                hidden=hidden,
                heads=heads,
                kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                intermediate=int(config["intermediate_size"]),
                vocab=int(config["vocab_size"]),
                max_positions=int(config.get("max_position_embeddings", 2048)),
                tied=bool(config.get("tie_word_embeddings", False)),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise LiveBackendError(f"Llama config.json: missing or bad field ({err!r})") from None

    @property
    def group_heads(self) -> int:
        return self.heads // self.kv_heads


def _hf(i: int, name: str) -> str:
    return f"model.layers.{i}.{name}.weight"


def _mg(i: int, name: str) -> str:
    return f"decoder.layers.{i}.{name}.weight"


_RENAMED = (
    ("input_layernorm", "input_layernorm"),
    ("self_attn.o_proj", "self_attention.linear_proj"),
    ("post_attention_layernorm", "pre_mlp_layernorm"),
    ("mlp.down_proj", "mlp.linear_fc2"),
)


def _take(state: Mapping[str, torch.Tensor], name: str, side: str) -> torch.Tensor:
    if name not in state:
        raise LiveBackendError(f"{side} state dict: missing weight {name!r}")
    return state[name]


def hf_to_megatron(hf: Mapping[str, torch.Tensor], shape: LlamaShape) -> dict[str, torch.Tensor]:
    """HF Llama names and layout -> megatron GPTModel (local spec) names and layout."""
    out = {
        "embedding.word_embeddings.weight": _take(hf, "model.embed_tokens.weight", "HF"),
        "decoder.final_layernorm.weight": _take(hf, "model.norm.weight", "HF"),
    }
    if not shape.tied:
        out["output_layer.weight"] = _take(hf, "lm_head.weight", "HF")
    d, g = shape.head_dim, shape.group_heads
    for i in range(shape.layers):
        for hf_name, mg_name in _RENAMED:
            out[_mg(i, mg_name)] = _take(hf, _hf(i, hf_name), "HF")
        q = _take(hf, _hf(i, "self_attn.q_proj"), "HF").reshape(shape.kv_heads, g * d, -1)
        k = _take(hf, _hf(i, "self_attn.k_proj"), "HF").reshape(shape.kv_heads, d, -1)
        v = _take(hf, _hf(i, "self_attn.v_proj"), "HF").reshape(shape.kv_heads, d, -1)
        out[_mg(i, "self_attention.linear_qkv")] = torch.cat([q, k, v], dim=1).reshape(-1, shape.hidden)
        gate = _take(hf, _hf(i, "mlp.gate_proj"), "HF")
        up = _take(hf, _hf(i, "mlp.up_proj"), "HF")
        out[_mg(i, "mlp.linear_fc1")] = torch.cat([gate, up], dim=0)
    return out


def megatron_to_hf(mg: Mapping[str, torch.Tensor], shape: LlamaShape) -> dict[str, torch.Tensor]:
    """The inverse of :func:`hf_to_megatron` (contiguous CPU tensors, HF names)."""
    out = {
        "model.embed_tokens.weight": _take(mg, "embedding.word_embeddings.weight", "megatron"),
        "model.norm.weight": _take(mg, "decoder.final_layernorm.weight", "megatron"),
    }
    if not shape.tied:
        out["lm_head.weight"] = _take(mg, "output_layer.weight", "megatron")
    d, g = shape.head_dim, shape.group_heads
    for i in range(shape.layers):
        for hf_name, mg_name in _RENAMED:
            out[_hf(i, hf_name)] = _take(mg, _mg(i, mg_name), "megatron")
        qkv = _take(mg, _mg(i, "self_attention.linear_qkv"), "megatron")
        q, k, v = qkv.reshape(shape.kv_heads, (g + 2) * d, -1).split([g * d, d, d], dim=1)
        out[_hf(i, "self_attn.q_proj")] = q.reshape(-1, shape.hidden)
        out[_hf(i, "self_attn.k_proj")] = k.reshape(-1, shape.hidden)
        out[_hf(i, "self_attn.v_proj")] = v.reshape(-1, shape.hidden)
        gate, up = _take(mg, _mg(i, "mlp.linear_fc1"), "megatron").chunk(2, dim=0)
        out[_hf(i, "mlp.gate_proj")] = gate
        out[_hf(i, "mlp.up_proj")] = up
    return {name: t.detach().to("cpu").contiguous() for name, t in out.items()}


def load_hf_weights(model_dir: str) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors by HF name (``*.safetensors`` preferred, else ``*.bin``)."""
    folder = Path(model_dir)
    files = sorted(folder.glob("*.safetensors"))
    state: dict[str, torch.Tensor] = {}
    if files:
        from safetensors.torch import load_file

        for path in files:
            state.update(load_file(str(path)))
    else:
        for path in sorted(folder.glob("pytorch_model*.bin")):
            state.update(torch.load(path, map_location="cpu", weights_only=True))
    if not state:
        raise LiveBackendError(f"{folder}: no *.safetensors or pytorch_model*.bin weights found")
    return state
