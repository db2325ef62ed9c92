"""``rlsched calibrate``'s measurements: every cost the simulator charges, measured on the
live backend's own components, driven the way a live run drives them.

* engines: a :class:`~rlsched.real.calibrate.engine.BenchEngine` actor built from the run's
  :class:`~rlsched.real.rollout.engine.EngineSettings` (decode steps against batch and context,
  prefill with and without prefix-cache hits, KV capacity, weight reloads);
* trainer: the live :class:`~rlsched.real.train.lane.TrainerLane` (micro-batches of known
  token counts at each data-parallel width, optimizer step + weight export + publish);
* role switches: the live driver's own moves -- engines killed and booted with the
  published weights, the trainer lane started, resized and offloaded -- timed per group of
  GPUs and direction (one group alone and the whole cluster), as the simulator charges
  ``CostModel.switch_seconds(role, gpus)`` per reassignment;
* tools: the shipped environment's real sandboxed calls (reset, an action, the final
  hidden-test run).

Every row is one measurement (``component``, its inputs, ``seconds``); the fitting code
(:mod:`~rlsched.sim.calibration`) never sees Ray or vLLM.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Row = dict[str, Any]
Say = Callable[[str], None]


@dataclass(frozen=True)
class BenchPlan:
    """What to measure; the defaults take about four minutes on a quiet 2-core CPU host."""

    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    decode_prompts: tuple[int, ...] = (32, 256, 1024)  # tokens per request
    decode_tokens: int = 24
    prefill_new: tuple[int, ...] = (16, 128, 512, 1536)
    prefill_cached: tuple[int, ...] = (0, 512, 1536)
    train_shapes: tuple[tuple[int, int], ...] = ((1, 256), (2, 512), (4, 384), (4, 1024), (8, 768), (2, 2048))
    sync_repeats: int = 3
    switch_rounds: int = 3
    tool_episodes: int = 3
    repeats: int = 2


def machine_peaks(seconds: float = 1.0) -> dict[str, float]:
    """FLOP/s of a float32 matmul and bytes/s of a large copy on one thread (the engine's
    and trainer's thread count on CPU): the nominal peaks the efficiencies are relative to."""
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(512, 512)
        b = torch.randn(512, 512)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            a @ b
            n += 1
        flops = n * 2 * 512**3 / (time.perf_counter() - t0)
        src = torch.empty(32 * 1024 * 1024 // 4)
        dst = torch.empty_like(src)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            dst.copy_(src)
            n += 1
        bw = n * 2 * src.numel() * 4 / (time.perf_counter() - t0)  # read + write
    finally:
        torch.set_num_threads(prev)
    return {"peak_flops": float(flops), "hbm_bw": float(bw)}


def checkpoint_state(model_dir: Path) -> dict[str, Any]:
    """The checkpoint's tensors with HF names (what the trainer exports), for publishing."""
    from safetensors.torch import load_file

    state: dict[str, Any] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        state.update(load_file(str(f)))
    return state


# ------------------------------------------------------------------------- engines
def bench_engine(actors: list[Any], plan: BenchPlan, say: Say) -> list[Row]:
    """Decode and prefill on every engine *at once*: in a run all engines generate at the
    same time, and on a CPU host they share the cores (one engine measured alone on an
    idle host decoded ~4x faster than the same engine in a live run)."""
    import ray

    rows: list[Row] = []
    seed = 0
    for prompt in plan.decode_prompts:
        for batch in plan.decode_batches:
            for _ in range(plan.repeats):
                seed += 1
                got = ray.get([a.bench_decode.remote(batch, prompt, plan.decode_tokens, seed * 7 + e)
                               for e, a in enumerate(actors)])
                rows += [{"component": "decode", "engine": e, **s} for e, steps in enumerate(got) for s in steps]
        say(f"decode: prompts of {prompt} tokens, batches {list(plan.decode_batches)}, {len(actors)} engines at once")
    for cached in plan.prefill_cached:
        for new in plan.prefill_new:
            for _ in range(plan.repeats):
                seed += 1
                got = ray.get([a.bench_prefill.remote(new, cached, seed * 7 + e) for e, a in enumerate(actors)])
                rows += [{"component": "prefill", "engine": e, **r} for e, r in enumerate(got)]
    say(f"prefill: {len(plan.prefill_new) * len(plan.prefill_cached)} shapes, with and without prefix hits")
    return rows


def bench_sync(actor: Any, state: dict[str, Any], tied: bool, plan: BenchPlan, say: Say) -> list[Row]:
    """Weight reloads of the whole model and of parts of it (the bytes axis), each a
    ``ray.put`` + ``update_weights`` round trip as the live driver's SyncWeights does."""
    import ray

    from rlsched.real.train.weights import to_vllm_names

    named = to_vllm_names(state, tied=tied)
    names = sorted(named)
    layer0 = [n for n in names if ".layers." not in n or ".layers.0." in n]
    subsets = [("all", names), ("layer0+embed", layer0), ("embed", [n for n in names if "embed" in n])]
    rows: list[Row] = []
    version = 100
    for label, keep in subsets:
        part = {n: named[n] for n in keep}
        nbytes = sum(int(t.numel() * t.element_size()) for t in part.values())
        ref = ray.put(part)
        for _ in range(plan.sync_repeats):
            version += 1
            t0 = time.perf_counter()
            try:
                ray.get(actor.update_weights.remote(ref, version))
            except Exception as exc:  # a partial reload the engine refuses: keep the whole-model rows
                say(f"sync: partial reload ({label}) not accepted: {str(exc).splitlines()[0][:80]}")
                break
            rows.append({"component": "sync", "bytes": nbytes, "subset": label,
                         "seconds": time.perf_counter() - t0})
    # leave the engine with the whole checkpoint loaded
    ray.get(actor.update_weights.remote(ray.put(named), version + 1))
    say(f"sync: {len(rows)} reloads")
    return rows


# ------------------------------------------------------------------------- trainer
def bench_train(lane: Any, world: int, vocab: int, plan: BenchPlan, seed: int) -> list[Row]:
    from rlsched.real.train.grpo import Sample

    rng = random.Random(seed)
    rows: list[Row] = []
    for n, length in plan.train_shapes:
        for _ in range(plan.repeats):
            samples = []
            for i in range(n):
                ids = [rng.randrange(3, vocab) for _ in range(length)]
                mask = [0] * (length // 2) + [1] * (length - length // 2)
                samples.append(Sample(ids, mask, 1.0 if i % 2 else -1.0, f"g{n}"))
            r = lane.micro_batch(samples).result()
            rows.append({"component": "train", "samples": n, "tokens_each": length,
                         "tokens": n * length, "world": world, "seconds": r["seconds"]})
    return rows


def bench_optimizer(lane: Any, vocab: int, plan: BenchPlan, seed: int) -> list[Row]:
    """The lane's optimizer step: AdamW, export, publish (what a live step ends with)."""
    from rlsched.real.train.grpo import Sample

    rng = random.Random(seed)
    rows: list[Row] = []
    for _ in range(plan.repeats + 1):
        ids = [rng.randrange(3, vocab) for _ in range(64)]
        lane.micro_batch([Sample(ids, [1] * 64, 1.0, "opt")]).result()
        r = lane.optimizer_step().result()
        rows.append({"component": "optimizer", "seconds": r["seconds"], "bytes": r["nbytes"]})
    return rows


# -------------------------------------------------------------------------- tools
def bench_tools(make_env: Callable[[], Any], tasks: list[str], plan: BenchPlan, say: Say) -> list[Row]:
    """Real sandboxed calls: an episode's reset, one shell action, and SUBMIT (hidden tests)."""
    rows: list[Row] = []
    for k in range(plan.tool_episodes):
        env = make_env()
        try:
            task = tasks[k % len(tasks)]
            t0 = time.perf_counter()
            env.reset(task, seed=k)
            rows.append({"component": "tool", "kind": "reset", "seconds": time.perf_counter() - t0})
            for kind, text in (("run", "RUN: ls"), ("submit", "SUBMIT")):
                r = env.step(text)
                rows.append({"component": "tool", "kind": kind, "seconds": float(r.seconds)})
                if r.done:
                    break
        finally:
            env.close()
    say(f"tools: {len(rows)} calls in the shipped environment")
    return rows


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0
