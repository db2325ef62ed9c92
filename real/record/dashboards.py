"""Live metrics streamed to dashboards: TensorBoard event files and W&B (offline mode).

Why: the run record is written after each optimizer step, but users of verl, AReaL and
slime watch a run *while it goes* in TensorBoard or Weights & Biases. After each optimizer
step the live driver hands :func:`step_scalars` what it measured over that step, and every
logger the ``[logging]`` table (or ``--logger``) selected writes the scalars at the run's
version as the x-axis step.

Names follow verl's metric names where one exists (``rlsched/...`` where none does), so a
dashboard made for verl finds them:

=============================  ==============================================================
``critic/score/mean|max|min``  the reward of the trajectories trained in the step (verl: score)
``critic/rewards/mean``        the same mean (verl's sequence reward; no KL term here)
``actor/pg_loss``              token-mean policy-gradient loss over the step's micro-batches
``response_length/mean``       generated tokens per trained trajectory
``perf/total_num_tokens``      tokens trained in the step
``perf/throughput``            trained tokens per second per GPU over the step (verl's)
``perf/time_per_step``         seconds from the previous step to this one
``timing_s/step``              the same, verl's timing name
``timing_s/update_actor``      seconds the trainer computed (micro-batches + optimizer step)
``rlsched/generated_tokens_per_s``  tokens the engines generated per second over the step
``rlsched/staleness/max``      the step's largest staleness (trainer version - min version)
``rlsched/gpu_share/<state>``  share of GPU-seconds in each recorded state over the step
``rlsched/trajectories``       trajectories trained in the step
=============================  ==============================================================

A logger whose package is missing is one :class:`ConfigError` line naming the extra to
install, raised before any engine starts (:func:`check_available`).
"""

from __future__ import annotations

import importlib.util
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rlsched.cluster.config import LoggingConfig
from rlsched.cluster.errors import ConfigError

# the package each logger needs, and how to get it
_PACKAGES = {
    "tensorboard": ("tensorboard", "pip install -e '.[logging]' (or pip install tensorboard)"),
    "wandb": ("wandb", "pip install wandb"),
}


def check_available(cfg: LoggingConfig) -> None:
    """One line for the first selected logger whose package is not installed."""
    for name in cfg.backends:
        module, how = _PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"[logging] logger {name!r} needs the {module} package, which is not installed: {how}")


class MetricLogger(Protocol):
    def log(self, scalars: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class TensorBoardLogger:
    """Scalars into a TensorBoard event file in ``logdir`` (tensorboard's own writer: no
    torch or TensorFlow needed). Each :meth:`log` is flushed, so a running TensorBoard
    shows the step as soon as it is trained."""

    def __init__(self, logdir: Path) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        Path(logdir).mkdir(parents=True, exist_ok=True)
        self.writer = EventFileWriter(str(logdir))
        self.logdir = Path(logdir)

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        values = [self._summary.Value(tag=k, simple_value=float(v)) for k, v in scalars.items()]
        self.writer.add_event(self._event(wall_time=time.time(), step=int(step),
                                          summary=self._summary(value=values)))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """Scalars into an offline W&B run under ``directory`` (``wandb sync`` uploads it later;
    a live run never needs the network)."""

    def __init__(self, directory: Path, *, project: str, name: str, run_id: str, config: dict[str, Any]) -> None:
        import wandb

        Path(directory).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=name, id=run_id, dir=str(directory), mode="offline",
                              config=config, resume="allow")

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        self.run.log(dict(scalars), step=int(step))

    def close(self) -> None:
        self.run.finish()


def open_loggers(cfg: LoggingConfig, run_dir: Path, *, config: dict[str, Any] | None = None) -> list[MetricLogger]:
    """The loggers ``cfg`` selects, writing under ``cfg.dir`` or the run directory."""
    check_available(cfg)
    base = Path(cfg.dir) if cfg.dir else Path(run_dir)
    name = cfg.name or Path(run_dir).name
    out: list[MetricLogger] = []
    for backend in cfg.backends:
        if backend == "tensorboard":
            out.append(TensorBoardLogger(base / "tensorboard" if not cfg.dir else base))
        elif backend == "wandb":
            run_id = "".join(c if c.isalnum() else "-" for c in name)[:60] or "rlsched"
            out.append(WandbLogger(base, project=cfg.project, name=name, run_id=run_id, config=config or {}))
    return out


@dataclass(frozen=True)
class StepSample:
    """What the driver measured over one optimizer step (from the previous step to this one)."""

    version: int  # the version the step produced (the x-axis)
    seconds: float  # run-clock seconds since the previous step (or the run's start)
    gpus: int
    trained_tokens: int
    train_seconds: float
    max_staleness: int
    rewards: Sequence[float]  # of the trajectories trained in the step
    output_tokens: Sequence[int]  # generated tokens of the same trajectories
    loss_sum: float | None  # summed policy-gradient loss of the step's micro-batches
    loss_tokens: int  # the tokens that sum is over
    generated_tokens: int  # all engines, over the step
    state_seconds: Mapping[str, float]  # GPU-seconds per recorded state, over the step


def step_scalars(s: StepSample) -> dict[str, float]:
    """The scalars logged for one step (see the module docstring for names)."""
    out: dict[str, float] = {
        "perf/total_num_tokens": float(s.trained_tokens),
        "timing_s/step": s.seconds,
        "perf/time_per_step": s.seconds,
        "timing_s/update_actor": s.train_seconds,
        "rlsched/staleness/max": float(s.max_staleness),
        "rlsched/trajectories": float(len(s.rewards)),
    }
    if s.seconds > 0 and s.gpus > 0:
        out["perf/throughput"] = s.trained_tokens / (s.seconds * s.gpus)
    if s.seconds > 0:
        out["rlsched/generated_tokens_per_s"] = s.generated_tokens / s.seconds
    rewards = [r for r in s.rewards if math.isfinite(r)]
    if rewards:
        out["critic/score/mean"] = sum(rewards) / len(rewards)
        out["critic/score/max"] = max(rewards)
        out["critic/score/min"] = min(rewards)
        out["critic/rewards/mean"] = out["critic/score/mean"]
    if s.output_tokens:
        out["response_length/mean"] = sum(s.output_tokens) / len(s.output_tokens)
    if s.loss_sum is not None and s.loss_tokens > 0:
        out["actor/pg_loss"] = s.loss_sum / s.loss_tokens
    total = sum(s.state_seconds.values())
    if total > 0:
        for state, secs in sorted(s.state_seconds.items()):
            out[f"rlsched/gpu_share/{state}"] = secs / total
    return out


def seconds_delta(now: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    """Per-state seconds added since ``before`` (states new since then count whole)."""
    return {k: v - before.get(k, 0.0) for k, v in now.items() if v - before.get(k, 0.0) > 0}


def loss_of(micro_batches: Iterable[Mapping[str, Any]]) -> tuple[float | None, int]:
    """(summed loss, trained tokens) over micro-batch results (each has its token-mean
    ``loss`` over its ``trained_tokens``); None when none reports a loss."""
    total, tokens, seen = 0.0, 0, False
    for r in micro_batches:
        n = int(r.get("trained_tokens", 0))
        if "loss_sum" in r:
            total += float(r["loss_sum"])
        elif "loss" in r:
            total += float(r["loss"]) * n
        else:
            continue
        seen = True
        tokens += n
    return (total if seen else None), tokens
