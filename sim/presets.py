"""Model and GPU presets: published shapes and datasheet figures, each with its source.

Why: a user deciding how to spend a cluster should not have to type 20 constants, and a
figure without a source cannot be checked. ``--model NAME --gpu NAME`` (or ``[cost]
model = ... gpu = ...``) starts the cost model from these; a cost file and ``[cost]``
fields still override any of them. The sources are listed again, with the derivations,
in ``sim/COST_MODEL.md``.

The default is a preset: :data:`DEFAULT_PRESET` (Qwen2.5-32B on H200s, the shape and GPU
the flat :class:`CostModel` defaults were always documented as), so a schedule the
simulator accepts by default is one such a cluster can run (a trainer of at least its
memory floor, resharding and topology charged). ``--model none`` (or ``[cost] model =
"none"``) gives the historic flat model: :class:`CostModel`'s own defaults, with no
trainer floor, free resharding, perfect scaling and one flat fabric.
:func:`default_cost` is what every front door starts from.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from typing import Any

from rlsched.cluster.errors import ConfigError

from .cost import CostModel

#: (model, gpu) every cost model starts from when none is named; ``None``: the historic
#: defaults of :class:`CostModel` (no trainer floor, flat fabric, dense). Qwen2.5-32B on
#: H200: exactly the model shape and GPU figures of :class:`CostModel`'s defaults (the
#: shipped trace and the README describe that setup), plus what such a cluster imposes.
DEFAULT_PRESET: tuple[str, str] | None = ("qwen2.5-32b", "h200")

#: the name that selects no preset: the flat historic :class:`CostModel` defaults
#: (``--model none``, ``[cost] model = "none"``)
FLAT = "none"

#: the longest sequence a preset's trainer is sized for (tokens), unless overridden:
#: 128k, a common long-context training length; the reference's ~700k-token rollouts
#: need ``train_seq_tokens = 700000`` (see the regime bench).
TRAIN_SEQ_TOKENS = 131072.0


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    hbm_bytes: float
    hbm_bw: float
    peak_flops: float  # dense BF16
    gpus_per_node: int  # one NVLink / Infinity Fabric domain
    nvlink_bw: float  # per GPU, one direction
    fabric_bw: float  # per GPU NIC, one direction
    host_bw: float  # per GPU to host (PCIe), one direction
    source: str


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    params: float  # total
    layers: int
    hidden: int  # residual-stream width
    d_model: int  # attention width in the FLOPs term (query heads x head dim, see COST_MODEL.md)
    kv_heads: int
    head_dim: int
    bytes_per_param: float  # as served
    active_params: float = 0.0  # MoE: per token (0: dense)
    experts: int = 0
    experts_per_token: int = 0
    source: str = ""

    @property
    def expert_params(self) -> float:
        """Routed-expert parameters, chosen so that total and active are the card's:
        ``active = total - E_p * (1 - k/E)``."""
        if not self.experts:
            return 0.0
        return (self.params - self.active_params) / (1.0 - self.experts_per_token / self.experts)


_NV_H = "NVIDIA H100/H200 SXM datasheets; HGX 8-GPU NVLink 4 (900 GB/s bidirectional); ConnectX-7 400 Gb/s per GPU; PCIe Gen5 x16"
GPUS: dict[str, GpuSpec] = {g.name: g for g in (
    GpuSpec("h100", 80e9, 3.35e12, 989e12, 8, 450e9, 50e9, 55e9,
            "NVIDIA H100 SXM datasheet: 80 GB HBM3, 3.35 TB/s, 989 TFLOPS dense BF16; " + _NV_H),
    GpuSpec("h200", 141e9, 4.8e12, 989e12, 8, 450e9, 50e9, 55e9,
            "NVIDIA H200 SXM datasheet: 141 GB HBM3e, 4.8 TB/s, 989 TFLOPS dense BF16; " + _NV_H),
    GpuSpec("b200", 180e9, 8e12, 2.25e15, 8, 900e9, 50e9, 55e9,
            "NVIDIA DGX/HGX B200 datasheet: 1,440 GB and 64 TB/s over 8 GPUs, 2.25 PFLOPS dense BF16 "
            "per GPU (4.5 sparse); NVLink 5 1.8 TB/s bidirectional; ConnectX-7 400 Gb/s; PCIe Gen5"),
    GpuSpec("gb200-nvl72", 186e9, 8e12, 2.5e15, 72, 900e9, 100e9, 200e9,
            "NVIDIA GB200 NVL72 datasheet: 13.4 TB HBM3e and 576 TB/s over 72 GPUs, 180 PFLOPS dense "
            "BF16 per rack; one 72-GPU NVLink 5 domain (1.8 TB/s bidirectional per GPU); ConnectX-8 "
            "800 Gb/s per GPU; NVLink-C2C to the Grace CPU 900 GB/s bidirectional (assumption: 200 GB/s used)"),
    GpuSpec("mi300x", 192e9, 5.3e12, 1307.4e12, 8, 448e9, 50e9, 55e9,
            "AMD Instinct MI300X datasheet: 192 GB HBM3, 5.3 TB/s, 1307.4 TFLOPS dense BF16; 8-GPU "
            "Infinity Fabric mesh, 7 links x 128 GB/s bidirectional = 448 GB/s one direction; 400 Gb/s NIC per GPU; PCIe Gen5"),
)}

MODELS: dict[str, ModelSpec] = {m.name: m for m in (
    ModelSpec("qwen2.5-7b", 7.61e9, 28, 3584, 3584, 4, 128, 2.0,
              source="Qwen2.5-7B model card (7.61B) and config.json (28 layers, hidden 3584, 28 heads, 4 KV heads)"),
    ModelSpec("qwen2.5-32b", 32.5e9, 64, 5120, 5120, 8, 128, 2.0,
              source="Qwen2.5-32B model card (32.5B) and config.json (64 layers, hidden 5120, 40 heads, 8 KV heads)"),
    ModelSpec("qwen2.5-72b", 72.7e9, 80, 8192, 8192, 8, 128, 2.0,
              source="Qwen2.5-72B model card (72.7B) and config.json (80 layers, hidden 8192, 64 heads, 8 KV heads)"),
    ModelSpec("qwen3-30b-a3b", 30.5e9, 48, 2048, 4096, 4, 128, 2.0, 3.3e9, 128, 8,
              source="Qwen3-30B-A3B model card (30.5B total, 3.3B active, 128 experts, 8 activated) and "
                     "config.json (48 layers, hidden 2048, 32 heads x 128, 4 KV heads)"),
    ModelSpec("qwen3-235b-a22b", 235e9, 94, 4096, 8192, 4, 128, 2.0, 22e9, 128, 8,
              source="Qwen3-235B-A22B model card (235B total, 22B active, 128 experts, 8 activated) and "
                     "config.json (94 layers, hidden 4096, 64 heads x 128, 4 KV heads)"),
    # MLA caches one 512-dim latent + a 64-dim RoPE key per token and layer: 576 elements,
    # written here as kv_heads=1 x head_dim=288 (the formula counts K and V: 2 x 288 = 576).
    # Attention FLOPs: 128 heads x (192 qk + 128 v) = 4 x d_model with d_model = 20480.
    ModelSpec("deepseek-v3", 671e9, 61, 7168, 20480, 1, 288, 1.0, 37e9, 256, 8,
              source="DeepSeek-V3 technical report (671B total, 37B active; 256 routed experts, 8 per "
                     "token; FP8 weights) and config.json (61 layers, hidden 7168, MLA kv_lora_rank 512 + "
                     "rope 64, 128 heads, qk 192 / v 128)"),
    ModelSpec("kimi-k2", 1.04e12, 61, 7168, 10240, 1, 288, 1.0, 32e9, 384, 8,
              source="Kimi K2 model card (1.04T total, 32B active, 384 experts, 8 per token, MLA, 64 "
                     "heads; block-FP8 weights) and config.json (61 layers, hidden 7168)"),
    ModelSpec("ref-2.4t", 2.4e12, 80, 8192, 16384, 1, 288, 1.0, 72e9, 512, 8,
              source="ASSUMPTION: a reference-scale MoE of ~2.4T total parameters; active share 3% "
                     "(72B, near Kimi K2's 3.1%), 512 experts, 8 per token, 80 layers, hidden 8192, "
                     "MLA-style 576-element KV as DeepSeek-V3, FP8 serving. No public model card."),
)}

#: the cost-model fields a preset does not set keep these values (sources in COST_MODEL.md)
PRESET_DEFAULTS: dict[str, float] = {
    "a2a_latency_s": 20e-6,  # assumption: one inter-node all-to-all of a decode batch (NCCL, IB)
    "sync_latency_s": 1.0,
}


def _pick(table: dict[str, Any], name: str, kind: str) -> Any:
    key = name.strip().lower()
    if key in table:
        return table[key]
    near = difflib.get_close_matches(key, table, n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    raise ConfigError(f"unknown {kind} preset {name!r}{hint}; known: {', '.join(table)}")


def model_fields(name: str) -> dict[str, float]:
    m: ModelSpec = _pick(MODELS, name, "model")
    out: dict[str, float] = {
        "params": m.params, "layers": m.layers, "d_model": m.d_model, "hidden": m.hidden,
        "kv_heads": m.kv_heads, "head_dim": m.head_dim, "bytes_per_param": m.bytes_per_param,
        "train_seq_tokens": TRAIN_SEQ_TOKENS,
    }
    if m.experts:
        out.update(expert_params=m.expert_params, experts=m.experts, experts_per_token=m.experts_per_token)
    return out


def gpu_fields(name: str) -> dict[str, float]:
    g: GpuSpec = _pick(GPUS, name, "GPU")
    return {
        "hbm_bytes": g.hbm_bytes, "hbm_bw": g.hbm_bw, "peak_flops": g.peak_flops,
        "gpus_per_node": g.gpus_per_node, "nvlink_bw": g.nvlink_bw, "fabric_bw": g.fabric_bw,
        "host_bw": g.host_bw,
        # the flat fields keep meaning something when read directly: a NIC per GPU
        "sync_bw": g.fabric_bw, "kv_transfer_bw": g.fabric_bw,
    }


def preset_cost(model: str | None, gpu: str | None, base: CostModel | None = None) -> CostModel:
    """``base`` (default: :class:`CostModel`'s own defaults) with a model and/or GPU preset
    applied. Naming one alone keeps the other part of ``base``; naming either switches the
    trainer-memory and topology model on (the model's ``train_seq_tokens``, the GPU's
    domains; with a model alone, an H200 HGX topology -- the historic default GPU)."""
    cost = base or CostModel()
    if model is None and gpu is None:
        return cost
    fields: dict[str, float] = dict(PRESET_DEFAULTS)
    fields.update(gpu_fields(gpu or "h200"))
    if model is not None:
        fields.update(model_fields(model))
    else:
        fields["train_seq_tokens"] = TRAIN_SEQ_TOKENS
    if gpu is None:  # keep the base's GPU figures, take only the H200-class topology
        for k in ("hbm_bytes", "hbm_bw", "peak_flops"):
            fields.pop(k)
    src = f"preset {model or '-'} / {gpu or '-'}"
    return cost.with_overrides(fields, source=src)


def resolve_cost(model: str | None, gpu: str | None, cost_file: Any = None,
                 table: dict[str, Any] | None = None, source: str = "[cost]") -> CostModel:
    """The cost model a front door runs with: the preset named here (else the ``[cost]``
    table's ``model``/``gpu``, else :func:`default_cost`), then a cost file's fields, then
    the table's other fields."""
    rest = dict(table or {})
    for key in ("model", "gpu"):
        if key in rest and not isinstance(rest[key], str):
            raise ConfigError(f"{source}: {key}={rest[key]!r}: expected a preset name (a string)")
    for flag, name in (("--model", model), ("--gpu", gpu)):
        if name is not None and not name.strip():  # ("" fell through to the default preset)
            raise ConfigError(f"{flag} {name!r}: expected a preset name (rlsched cost list)")
    # where each name came from, for a message (the flag, else the config's [cost] key)
    origin = {key: flag if given is not None else f"{source} {key}"
              for key, flag, given in (("model", "--model", model), ("gpu", "--gpu", gpu))}
    model = model or rest.pop("model", None)
    gpu = gpu or rest.pop("gpu", None)
    rest.pop("model", None)
    rest.pop("gpu", None)
    named = [(origin[k], n) for k, n in (("model", model), ("gpu", gpu)) if n is not None]
    flat = [(o, n) for o, n in named if n.strip().lower() == FLAT]
    if flat:
        other = [(o, n) for o, n in named if n.strip().lower() != FLAT]
        if other:
            # (said "--model/--gpu (or <defaults> [cost] model/gpu) 'none' ...": neither
            # which of them was 'none' nor, with no --config, any file)
            raise ConfigError(f"{flat[0][0]} {flat[0][1]!r} is the flat historic cost model, which takes "
                              f"no preset; drop {other[0][1]!r} ({other[0][0]}) or name both a model and a GPU")
        base = CostModel()
    elif model is None and gpu is None:
        base = default_cost()
    else:
        base = preset_cost(model, gpu)
    if cost_file is not None:
        base = CostModel.from_file(cost_file, base=base)
    if rest:
        base = base.with_overrides(rest, source=source)
    return base


def default_cost() -> CostModel:
    """The cost model every front door starts from (see :data:`DEFAULT_PRESET`)."""
    if DEFAULT_PRESET is None:
        return CostModel()
    return preset_cost(*DEFAULT_PRESET)


def with_seq(cost: CostModel, tokens: float) -> CostModel:
    """``cost`` with its trainer sized for ``tokens``-token sequences."""
    return replace(cost, train_seq_tokens=float(tokens))
