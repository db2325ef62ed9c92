"""The simulator's cost model: every timing constant in one frozen object.

Defaults describe one documented reference setup -- a dense 32B decoder (Qwen2.5-32B
shape) served on tp=4 engines of NVIDIA H200 SXM GPUs and trained with Megatron-style
data/tensor parallelism -- with a source or a stated assumption for each constant (see
``sim/COST_MODEL.md``). ``rlsched calibrate`` replaces them with measured values; a cost
model file (TOML or JSON) holds any subset of the fields.

Formulas (all times in seconds, per engine of ``tp`` GPUs):

* decode step, batch ``B`` sequences holding ``C`` context tokens in total::

      t_step = decode_overhead_s + max(
          (weight_bytes + kv_bytes_per_token * C) / tp / (hbm_bw * decode_bw_eff),
          2 * params * B / (tp * peak_flops * decode_compute_eff))

  every sequence in the batch gains one token per step (shared-rate server).
* prefill of ``p`` new tokens after ``c`` cached ones::

      (2 * params * p + 4 * layers * d_model * p * (c + p / 2)) / (tp * peak_flops * prefill_eff)

* training a sequence of ``S`` tokens (forward + backward, causal attention)::

      flops = 6 * params * S + 6 * layers * d_model * S**2

  at ``train_mfu`` of peak on the trainer's GPUs; an optimizer step costs
  ``optimizer_step_s``.
* weight sync: ``sync_latency_s + weight_bytes / sync_bw`` (engines pause meanwhile).
* role switch of ``g`` GPUs that switch together (one engine's, or one GPU)::

      switch_to_<role>_s (0: use switch_s) + switch_to_<role>_per_gpu_s * (g - 1)

  the directions differ live (booting engines vs. growing the trainer), and a group costs
  more than one GPU, so each direction may have its own constant and per-GPU slope;
  ``switch_s`` alone (the default) charges every switch the same.
* migration of a trajectory's context: the cheaper of a KV transfer
  (``kv_bytes_per_token * ctx / kv_transfer_bw``; with a topology ``tp`` shards over NVLink
  within a domain or the NICs across, :meth:`CostModel.migrate_s`) and re-prefilling it.

These dataclass defaults are the flat historic model (``--model none``); the simulator's
default is the ``qwen2.5-32b``/``h200`` preset on top of them (``sim/presets.py``).
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from rlsched.cluster.config import read_config_text
from rlsched.cluster.errors import ConfigError, shown


@dataclass(frozen=True, slots=True)
class CostModel:
    # model (Qwen2.5-32B shape)
    params: float = 32.5e9
    layers: int = 64
    d_model: int = 5120
    kv_heads: int = 8
    head_dim: int = 128
    bytes_per_param: float = 2.0  # bf16 weights
    kv_bytes_per_elem: float = 2.0  # bf16 KV cache
    # GPU (H200 SXM datasheet)
    hbm_bytes: float = 141e9
    hbm_bw: float = 4.8e12
    peak_flops: float = 989e12  # dense BF16
    gpu_mem_util: float = 0.9  # fraction vLLM may use (its default)
    # achieved efficiencies (assumptions, to be calibrated)
    decode_bw_eff: float = 0.6
    decode_compute_eff: float = 0.5
    decode_overhead_s: float = 0.004
    prefill_eff: float = 0.5
    train_mfu: float = 0.35
    max_num_seqs: int = 256  # vLLM's default batch cap
    # interconnect and orchestration
    sync_bw: float = 25e9
    sync_latency_s: float = 1.0
    kv_transfer_bw: float = 50e9
    switch_s: float = 8.0
    switch_to_train_s: float = 0.0  # 0: use switch_s
    switch_to_rollout_s: float = 0.0  # 0: use switch_s
    switch_to_train_per_gpu_s: float = 0.0  # per GPU beyond the first switching together
    switch_to_rollout_per_gpu_s: float = 0.0  # per GPU beyond the first switching together
    optimizer_step_s: float = 1.0
    # ---- realism from presets (sim/presets.py; see sim/COST_MODEL.md). Every default
    # below switches its part off, so a cost model without a preset charges exactly what it
    # charged before these fields existed.
    # attention/residual shape beyond the KV layout (0: = d_model)
    hidden: int = 0  # residual-stream width (activation memory, all-to-all bytes)
    # mixture of experts (0 experts: dense)
    expert_params: float = 0.0  # parameters in routed experts, all layers (part of params)
    experts: int = 0  # routed experts per MoE layer
    experts_per_token: int = 0  # routed experts each token activates
    # trainer memory (train_seq_tokens 0: not modelled -> no floor, free resharding)
    train_seq_tokens: float = 0.0  # longest sequence the trainer must hold (tokens)
    train_weight_bytes: float = 2.0  # bf16 weights while training
    grad_bytes: float = 4.0  # fp32 main gradients (Megatron's default)
    optim_bytes: float = 12.0  # fp32 master weights + Adam m and v
    zero_stage: int = 1  # 1: optimizer sharded (Megatron distributed optimizer), 2: + grads, 3: + weights
    act_bytes_per_token_layer: float = 2.0  # per hidden unit: the checkpointed layer input (full recompute)
    act_working_bytes: float = 34.0  # per hidden unit and token: one layer's working set (Korthikanti et al.)
    grad_reduce_bytes: float = 2.0  # bytes per gradient on the wire (bf16 reduction)
    # topology (gpus_per_node 0: one flat fabric, sync_bw / kv_transfer_bw as before)
    gpus_per_node: int = 0  # GPUs in one NVLink domain (8 per HGX node, 72 per NVL72 rack)
    nvlink_bw: float = 0.0  # per GPU, one direction, inside the domain (0: sync_bw / kv_transfer_bw)
    fabric_bw: float = 0.0  # per GPU, one direction, between domains, its NIC (0: sync_bw / kv_transfer_bw)
    host_bw: float = 0.0  # per GPU to host memory: trainer offload / onload (0: free)
    a2a_latency_s: float = 0.0  # one expert-parallel all-to-all across domains (decode, per layer x2)

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ConfigError(f"cost model: {f.name}={shown(v)}: expected a finite number")
            if v < 0 or (v == 0 and f.name not in _MAY_BE_ZERO):
                raise ConfigError(f"cost model: {f.name}={shown(v)}: must be > 0")
            if f.type in ("int", int) and v != int(v):  # (layers=1.5 was taken as it stood)
                raise ConfigError(f"cost model: {f.name}={shown(v)}: expected a whole number")
            lo, hi, unit = _RANGES[f.name]
            if (v != 0 and v < lo) or v > hi:
                raise ConfigError(
                    f"cost model: {f.name}={shown(v)}: expected {unit} in [{lo:g}, {hi:g}]"
                )
        for name in ("switch_to_train_s", "switch_to_rollout_s"):
            v = getattr(self, name)
            if 0 < v < self.switch_s:  # sim/bound.py charges switch_s as the cheapest switch
                raise ConfigError(f"cost model: {name}={shown(v)} is below switch_s={shown(self.switch_s)}: "
                                  "set switch_s to the cheapest switch (the lower bound charges it)")
        if self.kv_capacity_tokens(1) < 1 and self.kv_capacity_tokens(8) < 1 and not self.preset:
            raise ConfigError("cost model: the model's weights do not fit in GPU memory")
        if self.expert_params > self.params:
            raise ConfigError(f"cost model: expert_params={shown(self.expert_params)} exceeds "
                              f"params={shown(self.params)} (experts are part of the total)")
        if self.expert_params > 0 and not 0 < self.experts_per_token <= self.experts:
            # (expert_params is what makes a model MoE; experts alone are inert)
            raise ConfigError(f"cost model: expert_params={shown(self.expert_params)} needs 0 < "
                              f"experts_per_token <= experts; got experts={self.experts}, "
                              f"experts_per_token={self.experts_per_token}")

    # ---------------------------------------------------------------- derived
    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes_per_elem

    @property
    def moe(self) -> bool:
        return self.expert_params > 0

    @property
    def active_params(self) -> float:
        """Parameters one token uses: all but the routed experts it does not visit."""
        if not self.moe:
            return self.params
        return self.params - self.expert_params * (1.0 - self.experts_per_token / self.experts)

    @property
    def modelled(self) -> bool:
        """Trainer memory (floor, resharding, scaling) is modelled (a preset set it)."""
        return self.train_seq_tokens > 0

    @property
    def preset(self) -> bool:
        """A preset's realism is on (trainer memory or topology): engines may need more than
        8 GPUs, which the driver checks against the run's tp instead of refusing at load."""
        return self.modelled or self.gpus_per_node > 0

    @property
    def width(self) -> int:
        """Residual-stream width (``hidden``, or ``d_model`` when unset)."""
        return self.hidden or self.d_model

    def kv_capacity_tokens(self, tp: int) -> int:
        free = tp * self.hbm_bytes * self.gpu_mem_util - self.weight_bytes
        return max(0, int(free // self.kv_bytes_per_token))

    def spans_nodes(self, first_gpu: int, count: int) -> bool:
        """GPUs ``first_gpu .. first_gpu+count-1`` leave one NVLink domain (flat: never)."""
        n = self.gpus_per_node
        return n > 0 and first_gpu // n != (first_gpu + count - 1) // n

    def decode_coefficients(self, tp: int, spans_nodes: bool = False) -> DecodeCoeffs:
        """The decode-step formula's constants for an engine of ``tp`` GPUs: the one place
        they are folded (the engine's hot loop, the lower bound and calibration use these)."""
        per_seq = overhead = 0.0
        if self.moe and spans_nodes and self.a2a_latency_s > 0 and self.fabric_bw > 0:
            # expert parallelism across NVLink domains: a dispatch and a combine all-to-all
            # per MoE layer, each a latency plus the batch's routed activations over the NICs
            overhead = 2 * self.layers * self.a2a_latency_s
            per_seq = (2 * self.layers * self.experts_per_token * self.width * self.bytes_per_param
                       / (tp * self.fabric_bw))
        expert = self.expert_params * self.bytes_per_param if self.moe else 0.0
        return DecodeCoeffs(
            weights=self.weight_bytes - expert,
            expert=expert,
            miss=(1.0 - self.experts_per_token / self.experts) if self.moe else 1.0,
            kv_tok=self.kv_bytes_per_token,
            mem_den=tp * self.hbm_bw * self.decode_bw_eff,
            params2=2 * self.active_params,
            comp_den=tp * self.peak_flops * self.decode_compute_eff,
            overhead=self.decode_overhead_s + overhead,
            per_seq=per_seq,
        )

    def decode_step_s(self, tp: int, batch: int, context: float) -> float:
        return self.decode_coefficients(tp).step_s(batch, context)

    def prefill_s(self, tp: int, new: float, cached: float) -> float:
        flops = 2 * self.active_params * new + 4 * self.layers * self.d_model * new * (cached + new / 2)
        return flops / (tp * self.peak_flops * self.prefill_eff)

    def train_flops(self, tokens: float, prefix: float = 0.0) -> float:
        """FLOPs to train ``tokens`` new tokens that attend to ``prefix`` earlier ones."""
        end = prefix + tokens
        return 6 * self.active_params * tokens + 6 * self.layers * self.d_model * (end * end - prefix * prefix)

    def train_s(self, flops: float, gpus: int) -> float:
        return flops / (gpus * self.peak_flops * self.train_mfu)

    def sync_s(self, tp: int = 1, local: bool = False) -> float:
        """Weight sync to one engine of ``tp`` GPUs. Flat (no topology): the whole model over
        ``sync_bw``. With a topology each engine GPU receives its ``1/tp`` of the weights
        over NVLink when the trainer shares its domain (``local``), else over its NIC."""
        if not self.gpus_per_node:
            return self.sync_latency_s + self.weight_bytes / self.sync_bw
        bw = (self.nvlink_bw if local else self.fabric_bw) or self.sync_bw  # (unset: the flat one)
        return self.sync_latency_s + self.weight_bytes / (tp * bw)

    def switch_seconds(self, role: str, gpus: int) -> float:
        """Seconds for one switch of ``gpus`` GPUs that move together to ``role`` (a Role
        value: ``"train"``, ``"rollout"``; any other role costs ``switch_s``).

        Live, the directions differ several-fold (engines boot going to rollout; the
        trainer grows rank by rank going to train) and a group of GPUs that switch at once
        shares the host, so each direction has an optional constant and per-GPU slope. A
        zero constant falls back to ``switch_s`` and a zero slope adds nothing, which keeps
        every default output as it was before these fields existed.
        """
        if role == "train":
            base, slope = self.switch_to_train_s, self.switch_to_train_per_gpu_s
        elif role == "rollout":
            base, slope = self.switch_to_rollout_s, self.switch_to_rollout_per_gpu_s
        else:
            base, slope = 0.0, 0.0
        return (base if base > 0 else self.switch_s) + slope * max(0, gpus - 1)

    def migrate_s(self, tp: int, context: float, local: bool = False) -> tuple[float, bool]:
        """(seconds, by_prefill): the cheaper way to move ``context`` tokens of KV. With a
        topology the ``tp`` KV shards move in parallel over NVLink (``local``: both engines
        in one domain) or the NICs."""
        if self.gpus_per_node:
            bw = tp * ((self.nvlink_bw if local else self.fabric_bw) or self.kv_transfer_bw)
        else:
            bw = self.kv_transfer_bw
        transfer = self.kv_bytes_per_token * context / bw
        prefill = self.prefill_s(tp, context, 0.0)
        return (prefill, True) if prefill < transfer else (transfer, False)

    # -------------------------------------------------------------------- I/O
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def with_overrides(self, overrides: dict[str, Any], source: str = "cost model") -> CostModel:
        known = {f.name: f for f in fields(self)}
        clean: dict[str, Any] = {}
        for k, v in overrides.items():
            if k not in known:
                import difflib

                near = difflib.get_close_matches(k, known, n=1)
                hint = f" (did you mean {near[0]}?)" if near else ""
                raise ConfigError(f"{source}: unknown cost-model field {k!r}{hint}")
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ConfigError(f"{source}: {k}={shown(v)}: expected a number")
            if isinstance(v, int) and abs(v) > _MAX_WHOLE:  # float(v) would overflow
                raise ConfigError(f"{source}: {k}={shown(v)}: number out of range")
            clean[k] = int(v) if known[k].type in ("int", int) and float(v).is_integer() else v
        try:
            return replace(self, **clean)
        except ConfigError as err:
            raise ConfigError(f"{source}: {str(err).removeprefix('cost model: ')}") from None

    @classmethod
    def from_file(cls, path: str | Path, base: CostModel | None = None) -> CostModel:
        """A cost file's fields over ``base`` (default: the defaults)."""
        p = Path(path)
        try:
            text = read_config_text(p)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{p}: cannot read cost model ({exc.__class__.__name__})") from None
        kind = p.suffix.lstrip(".").upper() if p.suffix == ".json" else "TOML"
        try:
            data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
        except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{p}: not valid {kind}: {str(exc).splitlines()[0]}") from None
        except RecursionError:
            raise ConfigError(f"{p}: not a usable cost model: values are nested too deeply") from None
        except ValueError as exc:  # an integer past Python's 4300-digit conversion limit
            raise ConfigError(f"{p}: not a usable cost model: {str(exc).splitlines()[0]}") from None
        if isinstance(data, dict) and isinstance(data.get("cost"), dict):
            _refuse_config_tables(data, p)
            data = data["cost"]
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: expected a table of cost-model fields")
        return (base or cls()).with_overrides(data, source=str(p))


#: Top-level tables a cost-model file may hold beside ``[cost]`` (``rlsched calibrate``
#: writes ``[calibration]``: host facts and fit quality, which the loader ignores).
COST_FILE_TABLES = frozenset({"cost", "calibration"})


def field_bounds(name: str) -> tuple[float, float]:
    """The range a cost-model field must lie in (``_RANGES``), for a flag that sets it and
    names itself in its refusal."""
    low, high, _ = _RANGES[name]
    return low, high


def _refuse_config_tables(data: dict[str, Any], path: Path) -> None:
    """A run config given as ``--cost`` (``recommended.toml``: [cluster], [run], trace,
    [[policy]] and a [cost] table) was read for its [cost] alone: the run went ahead on the
    default cluster and trace, everything else in the file silently ignored."""
    extra = sorted(k for k in data if k not in COST_FILE_TABLES)
    if extra:
        shown_keys = ", ".join(extra[:4]) + (", ..." if len(extra) > 4 else "")
        raise ConfigError(f"{path}: holds {shown_keys} beside [cost]: a run config? give it as "
                          "--config (a cost-model file holds [cost] and [calibration] only)")


@dataclass(frozen=True, slots=True)
class DecodeCoeffs:
    """One decode step of an engine, constants folded (:meth:`CostModel.decode_coefficients`).

    ``step_s(B, C) = overhead + per_seq*B + max(mem_s(B, C), comp_s(B))``: the bytes every
    step reads (dense weights, the routed experts the batch touches, the batch's KV) at
    the engine's HBM bandwidth, or the active parameters' FLOPs, whichever is slower, plus a
    fixed cost and (expert parallelism across domains) an all-to-all cost per sequence.
    A batch of ``B`` tokens leaves one expert untouched with probability ``miss**B``
    (uniform routing), so it reads ``expert * (1 - miss**B)`` expert bytes. ``sim/engine.py``
    inlines exactly this arithmetic (same operations, same order: identical floats); a
    dense model has ``expert == per_seq == 0``, which adds exact zeros.
    """

    weights: float  # bytes read every step whatever the batch (all of a dense model)
    expert: float  # bytes of the routed experts (0: dense)
    miss: float  # chance one token leaves a given expert untouched (1 - k/E)
    kv_tok: float  # KV bytes per context token
    mem_den: float  # tp * hbm_bw * decode_bw_eff
    params2: float  # 2 * active parameters (FLOPs per generated token)
    comp_den: float  # tp * peak_flops * decode_compute_eff
    overhead: float  # seconds per step
    per_seq: float  # seconds per sequence in the batch (all-to-all across domains)

    def mem_s(self, batch: Any, context: Any) -> Any:
        w = self.weights if not self.expert else self.weights + self.expert * (1.0 - self.miss ** batch)
        return (w + self.kv_tok * context) / self.mem_den

    def comp_s(self, batch: Any) -> Any:
        return self.params2 * batch / self.comp_den

    def step_s(self, batch: Any, context: Any, maximum: Callable[[Any, Any], Any] = max) -> Any:
        """Seconds of one step (scalars; pass ``maximum=np.maximum`` for arrays)."""
        fixed = self.overhead if not self.per_seq else self.overhead + self.per_seq * batch
        return fixed + maximum(self.mem_s(batch, context), self.comp_s(batch))


_MAY_BE_ZERO = frozenset(
    {"hidden", "expert_params", "experts", "experts_per_token", "train_seq_tokens",
     "gpus_per_node", "nvlink_bw", "fabric_bw", "host_bw", "a2a_latency_s",
     "decode_overhead_s", "sync_latency_s", "switch_s", "switch_to_train_s",
     "switch_to_rollout_s", "switch_to_train_per_gpu_s", "switch_to_rollout_per_gpu_s",
     "optimizer_step_s"}
)
_MAX_WHOLE = 10**30  # larger whole numbers in a cost file are typos, not hardware
_MAX_SECONDS = 1e6  # ~12 days for one switch, sync or step: beyond it the clock stalls
# Accepted ranges per field: wide enough for any real device and for the hand-sized test
# models (1e-9 KV bytes, 1e21 FLOP/s to make a term vanish), narrow enough that the
# simulator's arithmetic stays finite and its clock keeps moving (1e-300 B/s made a rate
# of zero, 1e308 s of switch time stopped the simulated clock). Zero stays allowed where
# _MAY_BE_ZERO says so.
_COUNT = "a count"
_BYTES = "bytes"
_RATE = "per second"
_EFF = "an efficiency"
_SECS = "seconds"
_RANGES: dict[str, tuple[float, float, str]] = {
    "params": (1.0, 1e16, _COUNT),
    "layers": (1, 1e7, _COUNT),
    "d_model": (1, 1e7, _COUNT),
    "kv_heads": (1, 1e7, _COUNT),
    "head_dim": (1, 1e7, _COUNT),
    "bytes_per_param": (1e-12, 1e3, _BYTES),
    "kv_bytes_per_elem": (1e-12, 1e3, _BYTES),
    "hbm_bytes": (1.0, 1e20, _BYTES),
    "hbm_bw": (1.0, 1e24, _RATE),
    "peak_flops": (1.0, 1e24, _RATE),
    "gpu_mem_util": (1e-6, 1.0, "a fraction"),
    "decode_bw_eff": (1e-12, 1e3, _EFF),
    "decode_compute_eff": (1e-12, 1e3, _EFF),
    "decode_overhead_s": (0.0, _MAX_SECONDS, _SECS),
    "prefill_eff": (1e-12, 1e3, _EFF),
    "train_mfu": (1e-12, 1e3, _EFF),
    "max_num_seqs": (1, 1e7, _COUNT),
    "sync_bw": (1.0, 1e24, _RATE),
    "sync_latency_s": (0.0, _MAX_SECONDS, _SECS),
    "kv_transfer_bw": (1.0, 1e24, _RATE),
    "switch_s": (0.0, _MAX_SECONDS, _SECS),
    "switch_to_train_s": (0.0, _MAX_SECONDS, _SECS),
    "switch_to_rollout_s": (0.0, _MAX_SECONDS, _SECS),
    "switch_to_train_per_gpu_s": (0.0, _MAX_SECONDS, _SECS),
    "switch_to_rollout_per_gpu_s": (0.0, _MAX_SECONDS, _SECS),
    "optimizer_step_s": (0.0, _MAX_SECONDS, _SECS),
    "hidden": (1, 1e7, _COUNT),
    "expert_params": (1.0, 1e16, _COUNT),
    "experts": (1, 1e6, _COUNT),
    "experts_per_token": (1, 1e6, _COUNT),
    "train_seq_tokens": (1.0, 1e9, _COUNT),
    "train_weight_bytes": (1e-3, 16.0, _BYTES),
    "grad_bytes": (1e-3, 16.0, _BYTES),
    "optim_bytes": (1e-3, 64.0, _BYTES),
    "zero_stage": (1, 3, _COUNT),
    "act_bytes_per_token_layer": (1e-3, 1e3, _BYTES),
    "act_working_bytes": (1e-3, 1e4, _BYTES),
    "grad_reduce_bytes": (1e-3, 16.0, _BYTES),
    "gpus_per_node": (1, 1e5, _COUNT),
    "nvlink_bw": (1.0, 1e24, _RATE),
    "fabric_bw": (1.0, 1e24, _RATE),
    "host_bw": (1.0, 1e24, _RATE),
    "a2a_latency_s": (0.0, _MAX_SECONDS, _SECS),
}
