"""Settings of a live run: the ``[live]`` table of a config file, validated in one place.

Why a separate table: the simulator's ``[run]``/``[cluster]`` keys (GPUs, tp, steps,
tasks and samples per step, seed) mean the same thing live; everything only the live
backend needs (the checkpoint, the environment, generation limits, engine memory, the
learning rate) lives here, so a typo is an error and never a silent default.

``gpus``/``tp`` describe the *live host* when it differs from the planned cluster: a
``recommended.toml`` from ``rlsched plan`` keeps ``[cluster] gpus = 64`` (what ``compare``
simulates) while ``[live] gpus = 2`` is what this machine can run. Absent (0), the live run
uses ``[cluster]``. Command-line ``--gpus``/``--tp`` override both.
"""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from rlsched.cluster.errors import ConfigError


@dataclass(frozen=True)
class LiveSettings:
    model: str | None = None  # HF checkpoint dir; None: build the tiny model
    cache_dir: str | None = None  # where the tiny model is built (default: ~/.cache/rlsched)
    env: str = "coding"
    tasks_per_step: int = 2
    samples_per_task: int = 2
    max_turns: int = 3
    max_tokens_per_turn: int = 48
    max_observation_tokens: int = 256
    temperature: float = 1.0
    max_model_len: int = 4096
    max_num_seqs: int = 64
    kv_cache_mb: int = 128
    engine_threads: int = 1
    trainer_threads: int = 1
    lr: float = 1e-4
    env_workers: int = 8  # concurrent environment (tool) calls
    isolation: str = "auto"  # sandbox isolation for the coding environment
    # run tools in a sandbox weaker than sandbox.LIVE_MINIMUM (named so: an agent under RL
    # will find every gap; the run meta records what held)
    accept_weak_sandbox: bool = False
    tasks: tuple[str, ...] = ()  # task ids to draw from, in order (empty: all of the environment's)
    tool_seconds: float = 30.0  # wall-clock limit of one sandboxed command
    step_slice_s: float = 0.25  # longest engine call before the driver regains control
    start_timeout_s: float = 600.0  # an engine/trainer must start within this
    max_wall_s: float = 3600.0  # stop (incomplete) after this long
    object_store_mb: int = 256
    # Supervised warm start from the environment's generated demonstrations before RL
    # (warm_start.py); 0 steps: none. tool_share: the share of demonstrations using the tool.
    warm_start_steps: int = 0
    warm_start_demos: int = 256
    warm_start_lr: float = 3e-3
    warm_start_tool_share: float = 0.1
    gpus: int = 0  # GPU slots of the live host; 0: [cluster] gpus
    tp: int = 0  # GPUs per live engine; 0: [cluster] tp

    @classmethod
    def from_config(cls, live: dict[str, Any] | None, *, tasks_per_step: int | None = None,
                    samples_per_task: int | None = None) -> LiveSettings:
        data = dict(live or {})
        known = {f.name: f for f in fields(cls)}
        kw: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                near = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise ConfigError(f"[live] unknown key {key!r}{hint}")
            kw[key] = _convert(key, value, known[key].default)
        out = cls(**kw)
        if tasks_per_step is not None and "tasks_per_step" not in data:
            out = replace(out, tasks_per_step=tasks_per_step)
        if samples_per_task is not None and "samples_per_task" not in data:
            out = replace(out, samples_per_task=samples_per_task)
        out.check()
        return out

    def check(self) -> None:
        for name in ("tasks_per_step", "samples_per_task", "max_turns", "max_tokens_per_turn",
                     "max_observation_tokens", "max_model_len", "max_num_seqs", "kv_cache_mb",
                     "engine_threads", "trainer_threads", "env_workers", "object_store_mb"):
            v = getattr(self, name)
            if v < 1:
                raise ConfigError(f"[live] {name}={v!r}: expected an integer >= 1")
        for name in ("lr", "step_slice_s", "start_timeout_s", "max_wall_s", "tool_seconds"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"[live] {name}={getattr(self, name)!r}: expected a number > 0")
        if self.warm_start_steps < 0:
            raise ConfigError(f"[live] warm_start_steps={self.warm_start_steps!r}: expected an integer >= 0 (0: no warm start)")
        if self.warm_start_demos < 1 or not self.warm_start_lr > 0:
            raise ConfigError(f"[live] warm_start_demos={self.warm_start_demos!r}, warm_start_lr={self.warm_start_lr!r}: "
                              "expected an integer >= 1 and a number > 0")
        if not 0.0 <= self.warm_start_tool_share <= 1.0:
            raise ConfigError(f"[live] warm_start_tool_share={self.warm_start_tool_share!r}: expected a number in [0, 1]")
        for name in ("gpus", "tp"):
            v = getattr(self, name)
            if v < 0:
                raise ConfigError(f"[live] {name}={v!r}: expected an integer >= 1 (or leave it out to use [cluster] {name})")
        if self.temperature < 0:
            raise ConfigError(f"[live] temperature={self.temperature!r}: expected >= 0")
        if self.max_tokens_per_turn >= self.max_model_len:
            raise ConfigError(
                f"[live] max_tokens_per_turn={self.max_tokens_per_turn} must be below max_model_len={self.max_model_len}"
            )

    def cluster(self, gpus: int, tp: int) -> tuple[int, int]:
        """The live (gpus, tp): ``[live]`` where set, else the ``[cluster]`` values given.

        Checked here, naming ``[live]``, because the planned cluster's ``tp`` (say 4) may not
        fit the live host's slots (say 2) and the fix is a ``[live]`` key, not ``[cluster]``."""
        g, t = self.gpus or gpus, self.tp or tp
        src = "[live]" if self.gpus or self.tp else "[cluster]"
        if t < 1 or g % t or g // t < 2:
            fix = "set [live] tp = 1" if self.gpus and not self.tp else "use gpus a multiple of tp with at least two engines"
            raise ConfigError(f"{src} gpus={g}, tp={t}: a live run needs gpus = tp x (2 or more engines); {fix}")
        return g, t

    def cache_path(self) -> Path:
        if self.cache_dir:
            return Path(self.cache_dir).expanduser()
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(base) / "rlsched"


def refuse_unsupported(run: Any, *, resume: bool = False) -> None:
    """One line for each part of the run config (a ``RunConfig``) that the live backend
    cannot honour, so what ``compare`` simulated is never silently not what ``run --live``
    runs. (``sandbox_slots`` is honoured: see ``loop.driver``; ``processor`` packs each
    group as a prefix tree in the trainer: see ``train/prefix_tree.py``; tool, sync, gpu
    and trainer faults are injected for real: see ``loop.faults``.)"""
    from rlsched.real.loop.faults import check_live_faults

    check_live_faults(run.faults, resume=resume)


def _convert(key: str, value: Any, default: Any) -> Any:
    if isinstance(default, tuple):
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"[live] {key}={value!r}: expected a list of strings")
        return tuple(value)
    if default is None or isinstance(default, str):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"[live] {key}={value!r}: expected a string")
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"[live] {key}={value!r}: expected true or false")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"[live] {key}={value!r}: expected an integer")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"[live] {key}={value!r}: expected a number")
    if not math.isfinite(value):  # (TOML writes nan and inf: temperature = nan passed check())
        raise ConfigError(f"[live] {key}={value!r}: expected a finite number")
    return float(value)
