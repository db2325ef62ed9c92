"""A short supervised warm start from generated demonstrations, before RL begins.

Why: real RL starts from an instruct model that already follows the action format; the
tiny model built here starts from random weights and would emit noise forever. So a run
whose ``[live]`` table sets ``warm_start_steps`` first fine-tunes the checkpoint on
episodes a scripted agent played in the real environment (``env_lookup.demonstrations``:
real sandboxed tool calls, real observations), tokenized exactly as the live agent loop
tokenizes (``agent_loop``: same chat format, generated tokens trained, prompt and tool
output not). The demonstrations use the tool only ``warm_start_tool_share`` of the time,
so the warm-started policy knows the format but rarely looks -- RL must learn the rest.

The loss is the trainer's own (``TrainWorker.forward_backward`` with advantage 1 on every
sample is the token-mean negative log-likelihood), on the same Megatron model. The result
is a Hugging Face checkpoint folder beside the base one, cached by everything that
determines it (re-running the same config reuses it). It runs in a subprocess so the
driver process never initialises torch.distributed / Megatron state of its own.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rlsched.cluster.errors import ConfigError, LiveBackendError

STAMP = "rlsched-warm.json"
FORMAT = "rlsched-warm-v1"
BATCH = 16  # demonstrations per optimizer step


@dataclass(frozen=True)
class WarmSpec:
    """Everything that determines the warm-started checkpoint (its cache key)."""

    base: str  # the base checkpoint folder
    base_stamp: str  # its content stamp (the tiny model's spec, or its weights' size/mtime)
    env: str
    steps: int
    demos: int
    lr: float
    tool_share: float
    seed: int
    max_observation_tokens: int
    code: str = ""  # digest of the code that writes the demonstrations (a change rebuilds)
    format: str = FORMAT

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.__dict__, sort_keys=True).encode()).hexdigest()[:12]


def _base_stamp(model_dir: Path) -> str:
    stamp = model_dir / "rlsched-tiny.json"
    if stamp.is_file():
        return stamp.read_text()
    return ";".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in sorted(model_dir.glob("*.safetensors")))


def _code_digest() -> str:
    """The demonstration code's digest: the environment, the agent loop's tokenization and
    this module (so an edited task never reuses a stale warm-started checkpoint)."""
    from rlsched.real.envs import lookup
    from rlsched.real.rollout import agent_loop

    h = hashlib.sha256()
    for path in (lookup.__file__, agent_loop.__file__, __file__):
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:16]


def spec_for(model_dir: Path, settings: object, seed: int) -> WarmSpec:
    s = settings
    return WarmSpec(
        base=str(Path(model_dir).resolve()), base_stamp=_base_stamp(Path(model_dir)), env=s.env,  # type: ignore[attr-defined]
        steps=s.warm_start_steps, demos=s.warm_start_demos, lr=s.warm_start_lr,  # type: ignore[attr-defined]
        tool_share=s.warm_start_tool_share, seed=seed,  # type: ignore[attr-defined]
        max_observation_tokens=s.max_observation_tokens,  # type: ignore[attr-defined]
        code=_code_digest(),
    )


def warm_start(model_dir: Path, settings: object, *, seed: int) -> Path:
    """The warm-started checkpoint for ``settings`` (built now, or reused from the cache)."""
    spec = spec_for(Path(model_dir), settings, seed)
    if spec.env != "lookup":
        raise ConfigError(f"[live] warm_start_steps={spec.steps}: environment {spec.env!r} has no demonstrations "
                          "(only 'lookup' does); leave warm_start_steps out")
    out = Path(model_dir).resolve().parent / f"{Path(model_dir).name}-warm-{spec.key()}"
    stamp = out / STAMP
    if stamp.is_file():
        try:
            if json.loads(stamp.read_text()).get("spec") == spec.__dict__:
                return out
        except (OSError, json.JSONDecodeError):
            pass
    cmd = [sys.executable, "-m", "rlsched.real.train.warm_start", json.dumps({"spec": spec.__dict__, "out": str(out)})]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
        raise LiveBackendError(f"warm start of {model_dir} failed: {last}")
    return out


# ------------------------------------------------------------------ the subprocess side


def demonstration_samples(model_dir: Path, spec: WarmSpec) -> tuple[list, dict]:
    """Play ``spec.demos`` scripted episodes in the real environment; one SFT sample each."""
    from rlsched.real.envs.lookup import LookupEnvironment, demonstrations
    from rlsched.real.rollout.agent_loop import AgentTrajectory, Codec
    from rlsched.real.train.grpo import Sample

    codec = Codec(model_dir)
    if codec.eos_id is None:
        raise LiveBackendError(f"{model_dir}: the chat format has no end token; cannot write demonstrations")
    env = LookupEnvironment()
    rng = random.Random(f"warm/{spec.seed}")
    tasks = env.task_ids()
    samples, tool, reward = [], 0, 0.0
    try:
        for i in range(spec.demos):
            task = tasks[i % len(tasks)]
            # negative seeds: never one a run draws (run seeds are >= 0), so RL's episodes are new
            prompt, turns = demonstrations(task, -(i + 1), rng, tool_share=spec.tool_share, env=env)
            t = AgentTrajectory(f"demo-{i}", task, 0, seed=-(i + 1))
            t.start(codec, prompt)
            for action, observation, done, r in turns:
                t.add_output([*codec.encode(action), codec.eos_id], 0)
                t.finish_turn(0)
                if not done:
                    t.add_observation(codec, observation, True, spec.max_observation_tokens)
                reward += r
            tool += env.read_file
            samples.append(Sample(t.token_ids, t.loss_mask, 1.0, f"demo-{i}"))
    finally:
        env.close()
    return samples, {"demos": len(samples), "tool_share": tool / max(len(samples), 1),
                     "demo_reward": reward / max(len(samples), 1)}


def _main(arg: str) -> None:
    import torch
    from safetensors.torch import save_file

    from rlsched.real.train.worker import TrainWorker

    data = json.loads(arg)
    spec, out = WarmSpec(**data["spec"]), Path(data["out"])
    base = Path(spec.base)
    t0 = time.perf_counter()
    samples, info = demonstration_samples(base, spec)
    worker = TrainWorker(str(base), seed=spec.seed, lr=spec.lr, max_grad_norm=1.0)
    rng = random.Random(spec.seed)
    nll = []
    for _ in range(spec.steps):
        batch = rng.sample(samples, min(BATCH, len(samples)))
        r = worker.forward_backward(batch)
        worker.optimizer_step()
        nll.append(r["loss_sum"] / max(r["trained_tokens"], 1))
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in worker.hf_state_dict().items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".warm-", dir=out.parent))
    try:
        for f in base.iterdir():
            if f.is_file() and f.suffix != ".safetensors" and f.name != STAMP:
                shutil.copy2(f, tmp / f.name)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        info |= {"first_nll": nll[0] if nll else None, "last_nll": sum(nll[-10:]) / max(len(nll[-10:]), 1),
                 "seconds": time.perf_counter() - t0}
        (tmp / STAMP).write_text(json.dumps({"spec": spec.__dict__, "result": info}, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(info))


if __name__ == "__main__":
    _main(sys.argv[1])
