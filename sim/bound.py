"""A lower bound on the wall time of a run, for a policy's staleness bound.

No schedule can beat it under this cost model, so the gap to it says how much any policy
could still gain. It is built from two facts:

* **work**: every GPU-second of prefill, decode (at the best per-token cost any batch can
  reach: ``max_num_seqs`` sequences, KV traffic ignored) and training must be done by the
  cluster's GPUs, after the first role switch every GPU must make;
* **critical path**: a trajectory cannot finish faster than alone on an engine (batch 1,
  context of each turn at its smallest, prefix cache always hit, tools never queued), then
  be trained on every GPU at once; the step's optimizer step follows, and the next step's
  rollout cannot begin before the new weights reach an engine (the cheaper of a sync or a
  role switch: an engine serves the weights current when its switch *started*, as the
  simulator and a real cluster load them then). With staleness k, step s may start once version s-k exists, so steps
  overlap and the chain is computed accordingly. Policies that may defer a trajectory to a
  later step (partial rollout) get only the whole-run critical path.

Only the turns a run actually kept count (a trajectory cut at KV capacity or trained as
partial did less work), so the bound is valid for every policy and every run.
"""

from __future__ import annotations

import numpy as np

from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import ConfigError

from .cost import CostModel
from .memory import train_job_s, train_layout
from .workload import Batches, Workload


def lower_bound(
    workload: Workload,
    batches: Batches,
    cost: CostModel,
    config: RunConfig,
    staleness: int,
    defers: bool,
    turns_kept: dict[str, int] | None = None,
    train_flops: dict[str, float] | None = None,
    cut: set[str] | frozenset[str] = frozenset(),
) -> float:
    tp, gpus = config.tp, config.gpus
    p = workload.prompt.astype(np.float64)
    o = workload.output.astype(np.float64)
    n_rows = len(p)
    starts = workload.start
    # context before each turn (within its trajectory)
    tok = p + o
    cum = np.cumsum(tok)
    before_traj = np.repeat(cum[starts] - tok[starts], workload.turns)
    ctx_before = cum - tok - before_traj
    prefill = cost.prefill_s(tp, p, ctx_before)
    # alone on an engine (batch 1) at the turn's smallest context, the cheapest placement
    solo = prefill + o * cost.decode_coefficients(tp).step_s(1, ctx_before + p, np.maximum) + workload.env
    bmax = cost.max_num_seqs
    best_step = cost.decode_step_s(tp, bmax, 0.0)
    gpu_work = tp * (prefill + o * best_step / bmax)
    cs_solo = np.concatenate([[0.0], np.cumsum(solo)])
    cs_work = np.concatenate([[0.0], np.cumsum(gpu_work)])
    cs_tok = np.concatenate([[0.0], cum])
    del n_rows

    # the trainer works on whole replicas of its model-parallel group, at least its floor,
    # and every step reduces gradients at least once at a width of at least the floor
    layout = train_layout(cost)
    use = layout.usable(gpus)
    if use == 0:
        raise ConfigError(f"lower bound: {gpus} GPUs are fewer than the trainer's floor of {layout.min_gpus}")
    train_rate = use * cost.peak_flops * cost.train_mfu
    reduce = 0.0 if layout.memory is None else train_job_s(cost, layout, 0.0, 0.0, layout.min_gpus, False)
    step_crit: list[float] = []
    total_work = 0.0
    whole_crit = 0.0
    for batch in batches:
        crit = 0.0
        for rid, trace_id in batch:
            i = workload.index[trace_id]
            s = int(starts[i])
            k = int(workload.turns[i]) if turns_kept is None else turns_kept.get(rid, int(workload.turns[i]))
            if k <= 0:
                continue
            e = s + k
            ctx = cs_tok[e] - cs_tok[s]
            fl = train_flops[rid] if train_flops is not None and rid in train_flops else cost.train_flops(ctx)
            # a trajectory cut short (partial rollout) is trained without waiting for its
            # last kept turn's tool call, also when that was its last turn (``cut``: it did
            # not end on its own); a whole one ends with its last tool call
            t_solo = cs_solo[e] - cs_solo[s]
            if k < int(workload.turns[i]) or rid in cut:
                t_solo -= workload.env[e - 1]
            path = t_solo + fl / train_rate
            # (an interrupt keeping progress leaves a tool call running: a resumed
            # trajectory waits for its result, so tool time stays on its chain)
            whole_crit = max(whole_crit, path)
            crit = max(crit, path)
            total_work += (cs_work[e] - cs_work[s]) + fl / (cost.peak_flops * cost.train_mfu)
        step_crit.append(crit + reduce + cost.optimizer_step_s)
        total_work += reduce * layout.min_gpus
    start = cost.switch_s
    refresh = min(cost.sync_s(tp, local=True), cost.switch_s)
    work_bound = start + total_work / gpus
    steps = len(step_crit)
    if defers:
        chain = start + whole_crit + steps * cost.optimizer_step_s
        return float(max(work_bound, chain))
    t_end: list[float] = []
    for s in range(steps):
        r_start = start if s <= staleness else t_end[s - staleness - 1] + refresh
        prev = t_end[s - 1] + cost.optimizer_step_s if s else 0.0
        t_end.append(max(prev, r_start + step_crit[s]))
    return float(max(work_bound, t_end[-1] if t_end else start))

