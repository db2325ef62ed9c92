"""A lower bound on the wall time of a run, for a policy's staleness bound.

No schedule can beat it under this cost model, so the gap to it says how much any policy
could still gain. Each term below is proved from what the simulator enforces (a sketch
of each proof follows):

* **work**: every GPU-second of prefill, decode and training must be done by the
  cluster's ``G`` GPUs after the first role switch every GPU must make (all start IDLE and
  the cheapest switch is ``switch_s``): ``T >= switch_s + work / G``.

  - prefill of each kept turn at its cheapest (prefix cache always hit), ``tp`` GPUs.
  - decode (:func:`decode_engine_seconds`): an engine decoding ``b <= max_num_seqs``
    sequences (enforced: further turns wait for a slot) that hold ``C`` context tokens
    (``C <= `` its KV capacity: enforced, generated tokens that fill it preempt) advances
    every sequence by one token per ``h + max(w(b) + k*C, c*b)`` seconds (the cost
    model's step: overhead, weights and KV reads over bandwidth, or compute). A
    sequence's context while it decodes a turn is at least the turn's context at its
    start (context before it plus its prompt: the engine samples the context at every
    batch change, never below the join context). Summing the step over the run's decode
    intervals (``S`` steps, ``N`` tokens, ``K`` = sum over tokens of their context):
    ``max(w + kC, cb) >= w + kC`` and ``>= cb``, ``S >= N / max_num_seqs``,
    ``S >= K / capacity``, ``w(b) >= w(1)`` and ``w(b) >= b/max_num_seqs * w(max)``
    (an MoE's expert reads are concave in ``b``), so the engine-seconds are at least
    ``max(S*(h + w(1)), N/bmax*(h + w(bmax))) + k*K`` and ``S*h + c*N``. ``N`` and ``K``
    count only kept turns' tokens (wasted tokens only add). Before this the term charged
    ``N * step(max_num_seqs, 0) / max_num_seqs``: KV reads ignored.
  - training: every trained trajectory's FLOPs at ``train_mfu`` (the trajectory
    processor's cheapest packing when it is on), plus one gradient reduction per version
    that trained a trajectory (every micro-batch reduces and trains at one version; an
    ``OptimizerStep`` with nothing trained is legal, so a deferring policy may train
    several steps' batches in one micro-batch); the cheapest reduction at any width the
    trainer can have.

* **critical path of a trajectory**: alone on an engine (batch 1, context of each turn at
  its smallest, prefix cache always hit, tools never queued) it cannot finish its kept
  turns faster than ``solo`` (a trajectory cut short does not wait for its last kept
  turn's tool call).

* **the trainer's chain** (new): the trainer runs one job at a time (FIFO of micro-batches
  and optimizer steps), at most on every usable GPU of the cluster (``rate``). A
  trajectory is trained after it finished, so its micro-batch starts no earlier than its
  *release* ``r`` = when its rollout could begin + ``solo``. For any ``theta``, the
  trajectories released at ``theta`` or later are all trained after ``theta``: the step
  that trains them ends at or after ``theta + sum(flops) / rate + reduce +
  optimizer_step_s`` (the last micro-batch reduces, then the optimizer step). Taking
  ``theta`` at each release gives a one-machine bound with release times; taking it at the
  previous step's end gives ``end(s) >= end(s-1) + step s's training + reduce +
  optimizer step`` -- step s+1 is trained on the weights after step s's update. (Before
  this the chain charged only the single slowest trajectory's training per step.)

* **staleness**: with staleness ``k``, a trajectory trained at version ``s`` holds no
  token older than version ``s-k``, so its rollout cannot begin before version ``s-k``
  exists and reached an engine: the cheaper of a sync or a role switch after it is
  published (an engine serves the weights current when its switch *started*, as the
  simulator and a real cluster load them then). A turn moved mid-way keeps the oldest
  version that generated one of its kept tokens, but its prompt may have been prefilled
  on older weights and moved before its first token: the first kept turn's prefill is
  left off this release.

  A policy that does not defer (``defers`` False) promises to train step s's batch at
  version s; the chain is computed step by step on that promise. Both drivers enforce it
  at the command (``legality.check``, in the one driver loop); a caller that passes
  ``trained_at`` versions breaking it (a record made elsewhere) still gets the whole-run
  bound below. A deferring policy (partial rollout)
  gets only the whole-run bound: the one-machine bound over all trajectories released
  from the first switch, and the trainer's total work (every micro-batch and every
  optimizer step, one at a time); its window term is that same whole-run bound.

* **work in every window of the chain** (new): with the step promise kept, for any steps
  ``a < b`` every GPU-second of the following falls between ``E_a`` (step ``a``'s optimizer
  step ends, publishing version ``a+1``) and ``E_b``: the training of steps ``a+1 .. b``
  (trained at their own versions, after ``E_a``; FLOPs at ``train_mfu`` on every GPU of the
  micro-batch, one reduction each on at least the trainer's floor) and the rollout of steps
  ``a+k+1 .. b`` less each trajectory's first prefill (every kept token of step ``i`` is
  generated by weights ``>= i-k >= a+1``, and every later prefill follows one; all before
  step ``i`` trains), its decode charged as in the work term for just those tokens (the
  decode steps that carry any of them cost at least that: more sequences and context on
  an engine only add). The cluster has ``G`` GPUs, so ``E_b >= E_a + that / G``; ``a = -1``
  is the first switch's end, with the rollout of steps ``0 .. b``. ``E_a`` is taken from the
  same recursion, the chain's step value being the other candidate. A dropped trajectory is
  left out (its rollout has no deadline); faults only take GPUs away and add work. It binds
  where a window's work over the GPUs outweighs its longest trajectories (few GPUs per
  trajectory, episodes that grow over the run): the chain lets batches s and s+1 run as a
  pair on a cluster that could not do both batches' work in the pair's time.

Only the turns a run actually kept count (a trajectory cut at KV capacity or trained as
partial did less work), and a dropped trajectory is charged its rollout but no training,
so the bound is valid for every policy and every run. Faults only add time (lost work,
restarts, failed GPUs, hung tools cut no earlier than their recorded time), so it holds
under fault injection too.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import ConfigError

from .cost import CostModel
from .memory import TrainLayout, train_job_s, train_layout
from .workload import Batches, Workload

# KV capacity slack: the simulator relieves a full engine within float rounding and its
# --check allows (1 + 1e-6) x capacity + 1e-6 tokens; the bound allows a little more
KV_SLACK = 1e-6


def decode_engine_seconds(cost: CostModel, tp: int, tokens: float, kv_tokens: float) -> float:
    """The fewest engine-seconds (times ``tp`` for GPU-seconds) in which engines of ``tp``
    GPUs can decode ``tokens`` tokens whose contexts sum to at least ``kv_tokens``, at any
    batching the simulator allows (proof in the module docstring)."""
    if tokens <= 0:
        return 0.0
    co = cost.decode_coefficients(tp)
    bmax = cost.max_num_seqs
    cap = cost.kv_capacity_tokens(tp) * (1.0 + KV_SLACK) + 1.0
    steps = max(tokens / bmax, kv_tokens / cap)
    h = co.overhead
    kv = co.kv_tok * kv_tokens / co.mem_den
    memory = max(steps * (h + co.mem_s(1, 0.0)), tokens / bmax * (h + co.mem_s(bmax, 0.0))) + kv
    compute = steps * h + co.comp_s(1) * tokens
    return float(max(memory, compute))


def decode_engine_seconds_many(cost: CostModel, tp: int, tokens: np.ndarray, kv_tokens: np.ndarray) -> np.ndarray:
    """:func:`decode_engine_seconds` for arrays of ``(tokens, kv_tokens)`` at once (the
    window term evaluates it for every window ending at a step)."""
    tokens = np.asarray(tokens, dtype=np.float64)
    kv_tokens = np.asarray(kv_tokens, dtype=np.float64)
    co = cost.decode_coefficients(tp)
    bmax = cost.max_num_seqs
    cap = cost.kv_capacity_tokens(tp) * (1.0 + KV_SLACK) + 1.0
    steps = np.maximum(tokens / bmax, kv_tokens / cap)
    h = co.overhead
    kv = co.kv_tok * kv_tokens / co.mem_den
    memory = np.maximum(steps * (h + co.mem_s(1, 0.0)), tokens / bmax * (h + co.mem_s(bmax, 0.0))) + kv
    compute = steps * h + co.comp_s(1) * tokens
    return np.where(tokens > 0, np.maximum(memory, compute), 0.0)


def context_before(workload: Workload) -> np.ndarray:
    """Context tokens before each turn, within its trajectory (one entry per turn)."""
    tok = workload.prompt.astype(np.float64) + workload.output.astype(np.float64)
    cum = np.cumsum(tok)
    before_traj = np.repeat(cum[workload.start] - tok[workload.start], workload.turns)
    return cum - tok - before_traj


def turn_solo_seconds(workload: Workload, cost: CostModel, tp: int,
                      ctx_before: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(prefill seconds, solo seconds) of each turn: alone on an engine of ``tp`` GPUs
    (batch 1, the turn's smallest context, prefix cache hit, its tool call never queued) --
    the fastest any schedule can run it, so a trajectory's solo time (the sum over its
    kept turns) is a lower bound on its rollout from dispatch to finish."""
    if ctx_before is None:
        ctx_before = context_before(workload)
    p = workload.prompt.astype(np.float64)
    o = workload.output.astype(np.float64)
    prefill = cost.prefill_s(tp, p, ctx_before)
    solo = prefill + o * cost.decode_coefficients(tp).step_s(1, ctx_before + p, np.maximum) + workload.env
    return prefill, solo


def kept_solo_s(cs_solo: np.ndarray, env: np.ndarray, first: int, kept: int, turns: int,
                ended: bool) -> float:
    """A trajectory's solo seconds over its first ``kept`` of ``turns`` turns, from
    ``cs_solo`` (the running sum of :func:`turn_solo_seconds`'s solo, a 0 first) and the
    turns' tool seconds ``env``; its first turn is row ``first``. One cut short (partial
    rollout) or that did not end on its own (``ended`` False: cut, timed out, stopped) is
    trained without waiting for its last kept turn's tool call, also when that was its last
    turn; a whole one ends with its last tool call."""
    secs = cs_solo[first + kept] - cs_solo[first]
    if kept and (kept < turns or not ended):
        secs -= env[first + kept - 1]
    return secs


def min_reduce_s(cost: CostModel, layout: TrainLayout, usable: int) -> float:
    """The cheapest gradient reduction one micro-batch can cost at any width the trainer
    can have (whole replicas from its floor to ``usable``, inside one NVLink domain or not):
    a dense model's ring grows with the width, but an MoE's expert shards shrink as expert
    parallelism widens, so no one width is the cheapest for every model."""
    if layout.memory is None:
        return 0.0
    return min(train_job_s(cost, layout, 0.0, 0.0, g, spans)
               for g in range(layout.min_gpus, max(usable, layout.min_gpus) + 1, layout.unit)
               for spans in (False, True))


def release_bound(floor: float, jobs: list[tuple[float, float]]) -> float:
    """When one machine, free from ``floor`` on, can have finished every ``(release,
    seconds)`` job at the earliest: ``max(floor + all, max over r of r + the seconds of the
    jobs released at r or later)``."""
    total = floor + sum(p for _, p in jobs)
    acc = 0.0
    best = total
    for r, p in sorted(jobs, reverse=True):
        acc += p
        best = max(best, r + acc)
    return best


def lower_bound(*args, **kwargs) -> float:
    """The bound (seconds): the largest of :func:`bound_terms` (same arguments)."""
    return float(max(bound_terms(*args, **kwargs).values()))


def bound_terms(
    workload: Workload,
    batches: Batches,
    cost: CostModel,
    config: RunConfig,
    staleness: int,
    defers: bool,
    turns_kept: dict[str, int] | None = None,
    train_flops: dict[str, float] | None = None,
    cut: set[str] | frozenset[str] = frozenset(),
    dropped: set[str] | frozenset[str] = frozenset(),
    trained_at: dict[str, int] | None = None,
    turn_solo: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict[str, float]:
    """The bound's terms (seconds; the bound is the largest): ``work`` (GPU-seconds over
    the cluster), ``rollout`` (a dropped trajectory's rollout), ``trainer`` (the trainer's
    total), ``chain`` (the step chain, or the whole-run one-machine bound for a
    deferring policy) and ``window`` (the step chain with every window's work charged; the
    same whole-run bound for a deferring policy). ``turns_kept``: turns each run id kept (default: all);
    ``train_flops``: its cheapest training FLOPs (default: its kept context as one
    sequence); ``cut``: run ids that did not end on their own; ``dropped``: run ids never
    trained; ``trained_at``: the version each trained run id was trained at (a
    non-deferring run that trained one off its step -- refused by ``legality.check`` --
    gets the whole-run bound; the work term charges a reduction per version trained);
    ``turn_solo``: :func:`turn_solo_seconds` of the workload, if the caller has it."""
    tp, gpus = config.tp, config.gpus
    p = workload.prompt.astype(np.float64)
    o = workload.output.astype(np.float64)
    starts = workload.start
    ctx_before = context_before(workload)
    tok = p + o
    prefill, solo = turn_solo if turn_solo is not None else turn_solo_seconds(workload, cost, tp, ctx_before)

    def cs(x: np.ndarray) -> np.ndarray:
        return np.concatenate([[0.0], np.cumsum(x)])

    cs_solo = cs(solo)
    cs_prefill = cs(tp * prefill)
    cs_out = cs(o)
    cs_kv = cs(o * (ctx_before + p))  # each output token's smallest context
    cs_tok = cs(tok)

    # the trainer works on whole replicas of its model-parallel group, at least its floor,
    # and every step reduces gradients at least once at a width of at least the floor
    layout = train_layout(cost)
    use = layout.usable(gpus)
    if use == 0:
        raise ConfigError(f"lower bound: {gpus} GPUs are fewer than the trainer's floor of {layout.min_gpus}")
    train_rate = use * cost.peak_flops * cost.train_mfu
    reduce = min_reduce_s(cost, layout, use)
    opt = cost.optimizer_step_s
    start = cost.switch_s
    refresh = min(cost.sync_s(tp, local=True), cost.switch_s)

    # per step: (solo, training seconds, solo less the first turn's prefill)
    step_jobs: list[list[tuple[float, float, float]]] = []
    # per step, of its trained trajectories (the window term): output tokens, their KV
    # context, prefill GPU-seconds less each first turn's, training GPU-seconds
    n_batches = len(batches)
    win_out, win_kv, win_pre, win_train = (np.zeros(n_batches) for _ in range(4))
    rollout_only = 0.0  # the longest rollout of a dropped trajectory
    out_tokens = kv_tokens = other_work = 0.0
    promise_kept = True
    reduced_at: set[int] = set()  # versions that trained a job (each reduced at least once)
    stepped = 0  # steps with a job
    for s, batch in enumerate(batches):
        jobs: list[tuple[float, float, float]] = []
        for rid, trace_id in batch:
            i = workload.index[trace_id]
            b = int(starts[i])
            k = int(workload.turns[i]) if turns_kept is None else turns_kept.get(rid, int(workload.turns[i]))
            if k <= 0:
                continue
            e = b + k
            t_solo = kept_solo_s(cs_solo, workload.env, b, k, int(workload.turns[i]), rid not in cut)
            # (an interrupt keeping progress leaves a tool call running: a resumed
            # trajectory waits for its result, so tool time stays on its chain)
            out_tokens += cs_out[e] - cs_out[b]
            kv_tokens += cs_kv[e] - cs_kv[b]
            other_work += cs_prefill[e] - cs_prefill[b]
            if rid in dropped:
                rollout_only = max(rollout_only, t_solo)
                continue
            ctx = cs_tok[e] - cs_tok[b]
            fl = train_flops[rid] if train_flops is not None and rid in train_flops else cost.train_flops(ctx)
            other_work += fl / (cost.peak_flops * cost.train_mfu)
            win_out[s] += cs_out[e] - cs_out[b]
            win_kv[s] += cs_kv[e] - cs_kv[b]
            win_pre[s] += cs_prefill[e] - cs_prefill[b] - tp * prefill[b]
            win_train[s] += fl / (cost.peak_flops * cost.train_mfu)
            # (released at the step's rollout start + solo, less the first turn's prefill: a
            # turn may be prefilled on an engine with older weights and moved, KV and all,
            # before its first token -- staleness counts generated tokens)
            jobs.append((t_solo, fl / train_rate, t_solo - prefill[b]))
            if trained_at is not None and rid in trained_at:
                reduced_at.add(trained_at[rid])
                if trained_at[rid] != s:
                    promise_kept = False
        step_jobs.append(jobs)
        stepped += bool(jobs)
        if jobs:  # (the step reduces its gradients at least once, at its own version)
            win_train[s] += reduce * layout.min_gpus
    # one gradient reduction per micro-batch: at least one per version that trained a job
    # (a micro-batch trains at one version). Without ``trained_at``, a policy that does not
    # defer trains each step's jobs at its own version (legality.check enforces it); one
    # that defers may train every step's in one micro-batch after empty optimizer steps.
    if trained_at is not None:
        reductions = len(reduced_at)
    else:
        reductions = stepped if not defers else min(stepped, 1)
    other_work += reductions * reduce * layout.min_gpus
    decode = tp * decode_engine_seconds(cost, tp, out_tokens, kv_tokens)
    work_bound = start + (other_work + decode) / gpus
    steps = len(step_jobs)
    every = [job for jobs in step_jobs for job in jobs]
    terms = {"work": float(work_bound), "rollout": float(start + rollout_only),
             "trainer": float(start + steps * opt), "chain": float(start), "window": float(start)}
    if not every:
        return terms
    # the trainer's total: every micro-batch (one reduction at least) and optimizer step
    terms["trainer"] = float(start + sum(p for _, p, _ in every) + reduce + steps * opt)
    if defers or not promise_kept:
        # one machine, every trajectory released once it could have rolled out from the start
        terms["chain"] = terms["window"] = float(
            release_bound(start, [(start + r, p) for r, p, _ in every]) + reduce + opt)
        return terms
    chain = (step_jobs, staleness, start, refresh, reduce, opt)
    terms["chain"] = step_chain(*chain)
    terms["window"] = step_chain(*chain, window=window_work(staleness, start, cost, config,
                                                            (win_out, win_kv, win_pre, win_train)))
    return terms


Window = Callable[[int, list[float]], float]


def step_chain(step_jobs: list[list[tuple[float, float, float]]], staleness: int, start: float,
               refresh: float, reduce: float, opt: float, window: Window | None = None) -> float:
    """When the last step's optimizer step ends at the earliest, step by step (a policy that
    keeps the step promise): each step's trajectories released at its rollout's start
    (the first switch's end, or ``refresh`` after the optimizer step ``staleness + 1``
    before) plus their solo time, trained on one machine after the step before ends.
    ``window(s, ends)``: a further bound on step ``s``'s end from the ends before it."""
    t_end: list[float] = []
    for s, jobs in enumerate(step_jobs):
        prev = t_end[s - 1] if s else start
        if not jobs:
            value = prev + opt
        else:
            if s <= staleness:  # (no engine exists before the first switch)
                released = [(start + r, p) for r, p, _ in jobs]
            else:
                r_start = t_end[s - staleness - 1] + refresh
                released = [(r_start + r, p) for _, p, r in jobs]
            value = release_bound(prev, released) + reduce + opt
        t_end.append(value if window is None else max(value, window(s, t_end)))
    return float(t_end[-1]) if t_end else start


def window_work(staleness: int, start: float, cost: CostModel, config: RunConfig,
                per_step: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> Window:
    """The window term's bound on step ``b``'s end (proof in the module docstring):
    ``max over a < b of E_a + (GPU-seconds that must fall in [E_a, E_b]) / G`` (``E_-1``:
    the first switch's end). ``per_step``: each step's trained trajectories' output tokens,
    their KV context, prefill GPU-seconds less first turns, and training GPU-seconds (with
    one reduction)."""
    tp, gpus = config.tp, config.gpus
    cs_out, cs_kv, cs_pre, cs_train = (np.concatenate([[0.0], np.cumsum(x)]) for x in per_step)

    def bound(b: int, ends: list[float]) -> float:
        a1 = np.arange(b + 1)  # a + 1: windows [E_a, E_b], a = -1 .. b - 1
        lo = np.where(a1 == 0, 0, np.minimum(a1 + staleness, b + 1))  # first step rolled out
        e_a = np.array([start, *ends])
        decode = tp * decode_engine_seconds_many(cost, tp, cs_out[b + 1] - cs_out[lo], cs_kv[b + 1] - cs_kv[lo])
        gpu_s = decode + (cs_pre[b + 1] - cs_pre[lo]) + (cs_train[b + 1] - cs_train[a1])
        return float(np.max(e_a + gpu_s / gpus))

    return bound
