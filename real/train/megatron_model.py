"""Build a megatron-core ``GPTModel`` that is the same network as a HF Llama checkpoint.

The checkpoint's ``config.json`` fixes the shape (layers, hidden size, heads, KV groups,
MLP width, vocabulary, RMSNorm epsilon, rotary base, tied or untied embeddings); the
model uses megatron's *local* layer spec (no transformer-engine) so it runs wherever
torch does. Weights come from the checkpoint through ``convert.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from rlsched.cluster.errors import LiveBackendError
from rlsched.real.model.convert import LlamaShape


def read_hf_config(model_dir: str | Path) -> dict:
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise LiveBackendError(f"{path}: cannot read the checkpoint's config ({err})") from None
    arch = config.get("architectures") or ["?"]
    if config.get("model_type") != "llama" and "LlamaForCausalLM" not in arch:
        raise LiveBackendError(f"{path}: model_type {config.get('model_type')!r}, expected a Llama checkpoint")
    if config.get("rope_scaling"):
        raise LiveBackendError(f"{path}: rope_scaling={config['rope_scaling']!r} is not supported (expected none)")
    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag):
            raise LiveBackendError(f"{path}: {flag}=true is not supported (expected false)")
    if config.get("hidden_act", "silu") != "silu":
        raise LiveBackendError(f"{path}: hidden_act={config['hidden_act']!r}, expected 'silu'")
    return config


def build_gpt_model(config: dict) -> torch.nn.Module:
    """A ``GPTModel`` with the checkpoint's shape (weights not loaded yet)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    shape = LlamaShape.from_hf_config(config)
    tconfig = TransformerConfig(
        num_layers=shape.layers,
        hidden_size=shape.hidden,
        num_attention_heads=shape.heads,
        num_query_groups=shape.kv_heads,
        kv_channels=shape.head_dim,
        ffn_hidden_size=shape.intermediate,
        normalization="RMSNorm",
        layernorm_epsilon=float(config.get("rms_norm_eps", 1e-6)),
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=torch.float32,
        use_cpu_initialization=True,
        perform_initialization=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
    )
    return GPTModel(
        config=tconfig,
        transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=shape.vocab,
        max_sequence_length=shape.max_positions,
        parallel_output=True,
        share_embeddings_and_output_weights=shape.tied,
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=int(config.get("rope_theta", 10000)),
    )


def causal_mask(length: int) -> torch.Tensor:
    """Megatron's mask convention: True where attention is *not* allowed, shape [1,1,s,s]."""
    return torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)[None, None]


def gpt_logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Logits ``[batch, seq, vocab]`` for right-padded ``tokens`` ``[batch, seq]``.

    Right padding is safe under a causal mask: real positions never attend to the pads.
    """
    length = tokens.shape[1]
    positions = torch.arange(length, dtype=torch.long).unsqueeze(0).expand_as(tokens)
    return model(tokens, positions, causal_mask(length).to(tokens.device))


def gpt_logits_at(model: torch.nn.Module, tokens: torch.Tensor, positions: torch.Tensor,
                  mask: torch.Tensor) -> torch.Tensor:
    """Logits ``[1, n, vocab]`` of one packed row: ``tokens`` ``[1, n]`` at rotary
    ``positions`` ``[1, n]`` (not ``0..n-1``), attending as ``mask`` ``[1, 1, n, n]`` allows
    (True: not allowed) -- the prefix-tree forward pass (``prefix_tree.py``).

    megatron's ``GPTModel`` computes rotary embeddings for positions ``0..n-1`` from the
    sequence length alone (its ``position_ids`` feed only learned position embeddings, which
    a rope model has none of), so for the duration of this call the model's rotary module
    answers with the table rows of ``positions`` instead."""
    rope = model.rotary_pos_emb
    table = rope.get_emb(int(positions.max().item()) + 1, 0)  # [max + 1, 1, 1, dim]
    rows = table[positions[0].to(table.device)]
    rope.forward = lambda *args, **kwargs: rows  # an instance attribute shadows the method
    try:
        return model(tokens, positions, mask.to(tokens.device))
    finally:
        del rope.forward
