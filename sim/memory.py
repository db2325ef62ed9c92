"""What a trainer needs to exist: per-GPU memory, the smallest trainer that fits (its
floor) and the unit it grows by, and what changing its width costs.

Why: a schedule the simulator accepts must be one a real cluster can execute. A 32B
model's weights, gradients and Adam state are ~16 bytes per parameter before activations,
so no cluster trains it on one or two GPUs; the smallest trainer is one model-parallel
group (tensor x pipeline x context parallel) times the fewest data-parallel replicas whose
sharded optimizer state fits, and it grows by whole replicas. A cost model without a
preset (``train_seq_tokens == 0``) models none of this: floor 1, unit 1, free resharding,
perfect scaling -- the figures the simulator always charged.

Memory per GPU (Megatron-style, bytes; ``P`` parameters, ``mp = tp*pp``, ``d`` = data x
context parallel ranks that shard the optimizer):

* weights ``w*P/mp``, gradients ``g*P/mp``, optimizer ``o*P/(mp*d)`` at ZeRO stage 1
  (Megatron's distributed optimizer: ``6 + 12/d`` bytes per parameter at the defaults,
  as its documentation tabulates); stage 2 shards gradients too, stage 3 weights too.
* MoE: routed experts are sharded over ``ep`` expert-parallel ranks (the largest power of
  two dividing the expert count and at most ``tp*cp*dp``) instead of ``tp``; their
  optimizer over the remaining ``tp*cp*dp/ep`` ranks.
* activations with full recomputation and sequence parallelism, for one sequence of
  ``S = train_seq_tokens`` tokens split over ``cp*tp`` ranks: every layer's checkpointed
  input (``act_bytes_per_token_layer * hidden`` per token) plus one layer's working set
  (``act_working_bytes * hidden`` per token). With 1F1B pipelining the first stage holds
  ``pp`` micro-batches of ``layers/pp`` layers, so pipelining does not shrink this term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from rlsched.cluster.errors import ConfigError

from .cost import CostModel

_TP = (1, 2, 4, 8)
_PP = (1, 2, 4, 8, 16, 32)
_CP = (1, 2, 4, 8, 16, 32, 64, 128)
_MAX_GPUS = 1 << 17


@dataclass(frozen=True, slots=True)
class TrainMemory:
    """Bytes per GPU of one layout at one width."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    capacity: float  # hbm_bytes * gpu_mem_util

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    @property
    def state(self) -> float:
        """Bytes that move when the trainer reshards (everything but activations)."""
        return self.weights + self.grads + self.optimizer


@dataclass(frozen=True, slots=True)
class TrainLayout:
    """How the trainer is parallelised: a model-parallel group of ``unit`` GPUs
    (``tp*pp*cp``), replicated ``dp`` times; ``min_gpus`` is the floor."""

    tp: int
    pp: int
    cp: int
    min_dp: int
    memory: TrainMemory | None  # at the floor (None: not modelled)

    @property
    def unit(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def min_gpus(self) -> int:
        return self.unit * self.min_dp

    def usable(self, gpus: int) -> int:
        """GPUs of a trainer of ``gpus`` that do work: whole replicas only (0: below the floor)."""
        if gpus < self.min_gpus:
            return 0
        return gpus // self.unit * self.unit


NO_FLOOR = TrainLayout(1, 1, 1, 1, None)


def expert_parallel(cost: CostModel, ranks: int) -> int:
    """Expert-parallel ranks: the largest power of two that divides the expert count and is
    at most ``ranks`` (1 for a dense model)."""
    if not cost.moe:
        return 1
    ep = 1
    while ep * 2 <= ranks and cost.experts % (ep * 2) == 0:
        ep *= 2
    return ep


def train_memory(cost: CostModel, tp: int, pp: int, cp: int, dp: int) -> TrainMemory:
    """Per-GPU bytes of a trainer laid out as ``tp x pp x cp x dp`` (see the module doc)."""
    dense = cost.params - cost.expert_params
    d = dp * cp
    ep = expert_parallel(cost, tp * cp * dp)
    edp = tp * cp * dp // ep
    w, g, o = cost.train_weight_bytes, cost.grad_bytes, cost.optim_bytes
    shards = ((dense / (tp * pp), d), (cost.expert_params / (ep * pp), edp))
    weights = grads = optim = 0.0
    for n, dd in shards:
        weights += n * w / (dd if cost.zero_stage >= 3 else 1)
        grads += n * g / (dd if cost.zero_stage >= 2 else 1)
        optim += n * o / dd
    tokens = cost.train_seq_tokens / (cp * tp)
    act = tokens * cost.width * (cost.act_bytes_per_token_layer * cost.layers + cost.act_working_bytes)
    return TrainMemory(weights, grads, optim, act, cost.hbm_bytes * cost.gpu_mem_util)


@lru_cache(maxsize=64)
def train_layout(cost: CostModel) -> TrainLayout:
    """The smallest trainer that holds the model and one ``train_seq_tokens`` sequence.

    Of all layouts ``tp x pp x cp x dp`` (tp within one NVLink domain), the fewest GPUs;
    among equals the smallest model-parallel group (finer growth), then the least
    pipeline and context parallelism (less communication)."""
    if not cost.modelled:
        return NO_FLOOR
    node = cost.gpus_per_node or 8
    best: tuple[tuple[int, int, int, int], TrainLayout] | None = None
    for tp in (t for t in _TP if t <= node):
        for pp in (p for p in _PP if p <= cost.layers):
            for cp in _CP:
                unit = tp * pp * cp
                if unit > _MAX_GPUS:
                    continue
                # memory falls as dp grows (sharded state): the smallest dp that fits
                hi = _MAX_GPUS // unit
                if not train_memory(cost, tp, pp, cp, hi).fits:
                    continue
                lo = 0  # (does not fit at lo, fits at hi)
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (lo, mid) if train_memory(cost, tp, pp, cp, mid).fits else (mid, hi)
                dp = hi
                key = (unit * dp, unit, pp, cp)
                if best is None or key < best[0]:
                    best = (key, TrainLayout(tp, pp, cp, dp, train_memory(cost, tp, pp, cp, dp)))
    if best is None:
        raise ConfigError(
            f"cost model: no trainer of up to {_MAX_GPUS} GPUs holds {cost.params:.3g} parameters and a "
            f"{cost.train_seq_tokens:.0f}-token sequence in {cost.hbm_bytes / 1e9:g} GB per GPU "
            "(lower train_seq_tokens or use a larger GPU)")
    return best[1]


# ------------------------------------------------------------------- time at width g
def state_per_gpu(cost: CostModel, layout: TrainLayout, gpus: int) -> float:
    """Trainer-state bytes each of ``gpus`` GPUs holds (0 when not modelled or empty)."""
    use = layout.usable(gpus)
    if layout.memory is None or use == 0:
        return 0.0
    return train_memory(cost, layout.tp, layout.pp, layout.cp, use // layout.unit).state


def reshard_s(cost: CostModel, layout: TrainLayout, before: int, after: int, local: bool) -> float:
    """Seconds to move the trainer's state when it goes from ``before`` to ``after`` GPUs.

    From or to zero GPUs the state comes from / goes to host memory (each GPU its own shard
    over ``host_bw``, in parallel). Otherwise the GPUs that join receive a shard each, and
    when it shrinks the remaining GPUs receive the leavers' shards (``(before-after)/after``
    shards each), over NVLink when every GPU involved shares a domain with the trainer
    (``local``), else over the NICs. Not modelled: 0 (today's free resharding)."""
    if layout.memory is None or before == after:
        return 0.0
    if before == 0 or after == 0:
        return state_per_gpu(cost, layout, max(before, after)) / cost.host_bw if cost.host_bw else 0.0
    bw = (cost.nvlink_bw if local else cost.fabric_bw) or cost.sync_bw
    if after > before:
        return state_per_gpu(cost, layout, after) / bw
    return state_per_gpu(cost, layout, before) * (before - after) / after / bw


def train_job_s(cost: CostModel, layout: TrainLayout, flops: float, tokens: float, gpus: int,
                spans_nodes: bool) -> float:
    """Seconds of one micro-batch of ``flops`` (``tokens`` trained tokens) on ``gpus`` GPUs.

    Not modelled: ``CostModel.train_s`` (perfect scaling). Modelled: the compute on the
    usable GPUs (whole replicas), overlapped with context-parallel ring-attention traffic
    (the slower of the two), then the gradient reduction over the data x context parallel
    ranks (a ring: ``2(n-1)/n`` of each GPU's gradient bytes), over NVLink within one domain
    else the NICs. The reduction is charged per micro-batch because the width may change
    between micro-batches (elastic); a fixed-width trainer that accumulates could hide it.
    """
    if layout.memory is None:
        return cost.train_s(flops, gpus)
    use = layout.usable(gpus)
    if use == 0:
        raise ValueError(f"training on {gpus} GPUs, below the floor of {layout.min_gpus}")
    compute = cost.train_s(flops, use)
    dp = use // layout.unit
    bw_group = cost.fabric_bw if spans_nodes else (cost.nvlink_bw or cost.fabric_bw)
    bw_group = bw_group or cost.sync_bw
    cp = layout.cp
    comm_cp = 0.0
    if cp > 1:
        # each CP rank receives the K/V of the other cp-1 chunks per layer: forward, the
        # recomputed forward, and twice in backward (K/V and their gradients)
        per_layer = cost.kv_bytes_per_token / cost.layers
        cp_bw = (cost.fabric_bw or bw_group) if layout.tp * cp > (cost.gpus_per_node or 8) else bw_group
        comm_cp = (4 * cost.layers / layout.pp * (cp - 1) / cp * tokens / dp * per_layer / layout.tp) / cp_bw
    n = dp * cp
    dense = (cost.params - cost.expert_params) / (layout.tp * layout.pp)
    ep = expert_parallel(cost, layout.tp * n)
    grads = dense * cost.grad_reduce_bytes * 2 * (n - 1) / n
    en = layout.tp * n // ep
    if cost.moe and en > 1:
        grads += cost.expert_params / (ep * layout.pp) * cost.grad_reduce_bytes * 2 * (en - 1) / en
    reduce = grads / bw_group
    return max(compute, comm_cp) + reduce


def efficiency(cost: CostModel, layout: TrainLayout, tokens: float, gpus: int, spans_nodes: bool) -> float:
    """Share of perfect scaling a micro-batch of ``tokens`` one-sequence tokens reaches on
    ``gpus`` GPUs (for ``rlsched cost show``)."""
    flops = cost.train_flops(tokens)
    ideal = cost.train_s(flops, gpus)
    real = train_job_s(cost, layout, flops, tokens, gpus, spans_nodes)
    return ideal / real if real > 0 else math.nan


def below_floor(trainer_gpus: list[int], layout: TrainLayout, cluster: int) -> str:
    """The reason a stalled run's trainer could not run, if it was its memory floor."""
    if layout.min_gpus <= 1 or len(trainer_gpus) >= layout.min_gpus:
        return ""
    if cluster < layout.min_gpus:
        return f"; the cluster's {cluster} GPUs are fewer than the trainer's floor of {layout.min_gpus}"
    return (f"; the trainer holds {len(trainer_gpus)} GPUs, below its floor of {layout.min_gpus} "
            f"(it grows by {layout.unit}): give it at least {layout.min_gpus}")


def min_engine_gpus(cost: CostModel) -> int:
    """The smallest power-of-two engine whose memory holds the served weights (and a token)."""
    n = 1
    while cost.kv_capacity_tokens(n) < 1 and n < _MAX_GPUS:
        n *= 2
    return n


def trainer_floor(state: Any, cost: CostModel, tp: int, kv_capacity: int) -> TrainLayout:
    """The driver's setup: refuse an engine that cannot hold the weights (a preset's large
    model on too few GPUs per engine), tell the cluster state (and so the policies' view)
    the trainer's floor and the node size, and return the layout the trainer times its
    jobs with."""
    if cost.preset and kv_capacity < 1:
        need = min_engine_gpus(cost)
        if cost.kv_capacity_tokens(need) < 1:  # (it advised "use tp >= 131072", the search's cap)
            raise ConfigError(
                f"cost model: no engine of up to {need:,} GPUs holds the {cost.weight_bytes / 1e9:.0f} GB of weights "
                f"with hbm_bytes={cost.hbm_bytes:g} x gpu_mem_util={cost.gpu_mem_util:g} per GPU: check those two")
        raise ConfigError(
            f"cost model: an engine of tp={tp} GPUs cannot hold the {cost.weight_bytes / 1e9:.0f} GB of "
            f"weights in {cost.hbm_bytes / 1e9:g} GB per GPU: use tp >= {need}")
    state.node_size = cost.gpus_per_node
    layout = train_layout(cost)
    if layout.memory is not None:
        m = layout.memory
        if layout.min_gpus > state.num_gpus:  # (no policy could ever train: say so before running)
            raise ConfigError(
                f"cost model: training {cost.params / 1e9:.3g}B parameters on {cost.train_seq_tokens:.0f}-token "
                f"sequences needs at least {layout.min_gpus} GPUs (tp={layout.tp} pp={layout.pp} cp={layout.cp} "
                f"x dp={layout.min_dp}); the cluster has {state.num_gpus}: use --gpus >= {layout.min_gpus}, a "
                "smaller --model or train_seq_tokens, or --model none (the flat model, no trainer floor)")
        state.set_trainer_floor(layout.min_gpus, layout.unit, why=(
            f"tp={layout.tp} pp={layout.pp} cp={layout.cp} x dp={layout.min_dp}: {m.total / 1e9:.0f} of "
            f"{m.capacity / 1e9:.0f} GB per GPU for a {cost.train_seq_tokens:.0f}-token sequence"))
    return layout
