"""A tiny Llama checkpoint built locally, so the whole live path runs offline on a CPU.

Why build instead of download: tests and CI must not depend on a model hub, and the live
backend must exercise the same code path a real checkpoint takes (Hugging Face layout:
``config.json`` + ``model.safetensors`` + ``tokenizer.json``), so vLLM, the trainer and
the weight sync cannot tell the difference. Weights are random (seeded); the BPE tokenizer
is trained with the ``tokenizers`` library on the text shipped in ``real/data/``.

vLLM's CPU attention supports head sizes 32, 64, 80, ... only, hence ``hidden / heads``
defaults to 32. :func:`resolve_model` accepts a real checkpoint directory instead.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from rlsched.cluster.errors import LiveBackendError

CORPUS = Path(__file__).resolve().parent / "data" / "corpus.txt"
STAMP = "rlsched-tiny.json"
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
USER, ASSISTANT, END = "<|user|>", "<|assistant|>", "<|end|>"
SPECIAL_TOKENS = (PAD, BOS, EOS, USER, ASSISTANT, END)
# Rendered by vLLM / transformers for chat requests; the live driver renders the same
# format itself (agent_loop.ChatFormat reads this template).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|>\n{{ m['content'] }}<|end|>\n"
    "{% else %}<|user|>\n{{ m['content'] }}<|end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)  # vLLM CPU attention


@dataclass(frozen=True)
class TinySpec:
    """Everything that determines the built checkpoint (its cache key)."""

    seed: int = 0
    vocab_size: int = 4096
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 4
    layers: int = 2
    intermediate: int = 256
    max_positions: int = 4096
    init_std: float = 0.02
    corpus_bytes: int = 0  # size of the corpus the tokenizer was trained on

    def check(self) -> None:
        if self.hidden % self.heads or (self.hidden // self.heads) not in HEAD_SIZES:
            raise LiveBackendError(
                f"tiny model: hidden={self.hidden}, heads={self.heads} gives head size "
                f"{self.hidden / self.heads:g}; vLLM on CPU needs one of {HEAD_SIZES}"
            )
        if self.heads % self.kv_heads:
            raise LiveBackendError(f"tiny model: heads={self.heads} is not a multiple of kv_heads={self.kv_heads}")
        if self.vocab_size < 512:
            raise LiveBackendError(f"tiny model: vocab_size={self.vocab_size}; expected >= 512")


def build_tiny_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 4096,
    hidden: int = 128,
    heads: int = 4,
    kv_heads: int | None = None,
    layers: int = 2,
    intermediate: int | None = None,
    max_positions: int = 4096,
) -> Path:
    """Build (or reuse, if ``out_dir`` already holds the same spec) a tiny HF Llama model."""
    out = Path(out_dir)
    spec = TinySpec(
        seed=seed, vocab_size=vocab_size, hidden=hidden, heads=heads,
        kv_heads=kv_heads or heads, layers=layers, intermediate=intermediate or 2 * hidden,
        max_positions=max_positions, corpus_bytes=CORPUS.stat().st_size,
    )
    spec.check()
    stamp = out / STAMP
    if stamp.is_file():
        try:
            if json.loads(stamp.read_text()) == asdict(spec):
                return out
        except (OSError, json.JSONDecodeError):
            pass
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=out.parent))
    try:
        tok = _train_tokenizer(spec)
        tok.save(str(tmp / "tokenizer.json"))
        ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
        _write_configs(tmp, spec, ids)
        _write_weights(tmp, spec)
        (tmp / STAMP).write_text(json.dumps(asdict(spec), indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _train_tokenizer(spec: TinySpec):  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    text = CORPUS.read_text(encoding="utf-8")
    # Paragraph-sized pieces keep merges local, as a line-oriented corpus would.
    tok.train_from_iterator(text.split("\n\n"), trainer=trainer)
    return tok


def _write_configs(d: Path, spec: TinySpec, ids: dict[str, int]) -> None:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.intermediate,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.hidden // spec.heads,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_positions,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": spec.init_std,
        "bos_token_id": ids[BOS],
        "eos_token_id": ids[EOS],
        "pad_token_id": ids[PAD],
        "torch_dtype": "float32",
        "use_cache": True,
    }
    (d / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen = {"bos_token_id": ids[BOS], "eos_token_id": ids[EOS], "pad_token_id": ids[PAD]}
    (d / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": False,
        "model_max_length": spec.max_positions,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }
    (d / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    (d / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def hf_weight_shapes(spec: TinySpec) -> dict[str, tuple[int, ...]]:
    """HF Llama parameter names and shapes for ``spec`` (untied embeddings)."""
    h, d = spec.hidden, spec.hidden // spec.heads
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (spec.vocab_size, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (spec.vocab_size, h),
    }
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (spec.heads * d, h),
            p + "self_attn.k_proj.weight": (spec.kv_heads * d, h),
            p + "self_attn.v_proj.weight": (spec.kv_heads * d, h),
            p + "self_attn.o_proj.weight": (h, spec.heads * d),
            p + "mlp.gate_proj.weight": (spec.intermediate, h),
            p + "mlp.up_proj.weight": (spec.intermediate, h),
            p + "mlp.down_proj.weight": (h, spec.intermediate),
        }
    return shapes


def random_weights(spec: TinySpec, seed: int | None = None) -> dict[str, np.ndarray]:
    """Seeded random weights: N(0, init_std) matrices, RMSNorm scales of one."""
    rng = np.random.default_rng(spec.seed if seed is None else seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in hf_weight_shapes(spec).items():
        if name.endswith("norm.weight"):
            out[name] = np.ones(shape, dtype=np.float32)
        else:
            out[name] = rng.normal(0.0, spec.init_std, size=shape).astype(np.float32)
    return out


def _write_weights(d: Path, spec: TinySpec) -> None:
    from safetensors.numpy import save_file

    save_file(random_weights(spec), str(d / "model.safetensors"), metadata={"format": "pt"})


def resolve_model(model: str | Path | None, cache_dir: str | Path, *, seed: int = 0) -> Path:
    """The checkpoint directory to run: ``model`` if given (validated), else the tiny model
    built under ``cache_dir``. Problems are one :class:`LiveBackendError` line."""
    if model is None:
        return build_tiny_model(Path(cache_dir) / f"tiny-llama-s{seed}", seed=seed)
    path = Path(model)
    if not path.is_dir():
        raise LiveBackendError(f"--model {path}: not a directory (expected a Hugging Face checkpoint folder)")
    cfg = path / "config.json"
    try:
        config = json.loads(cfg.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LiveBackendError(f"{cfg}: unreadable checkpoint config ({exc.__class__.__name__})") from None
    if not isinstance(config, dict) or "architectures" not in config:
        raise LiveBackendError(f"{cfg}: no 'architectures' field; not a Hugging Face causal-LM config")
    if not (any(path.glob("*.safetensors")) or any(path.glob("pytorch_model*.bin"))):
        raise LiveBackendError(f"{path}: no *.safetensors or pytorch_model*.bin weights")
    if not (path / "tokenizer.json").is_file():
        raise LiveBackendError(f"{path}: no tokenizer.json (the live driver tokenizes with the `tokenizers` library)")
    return path
