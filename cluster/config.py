"""Run configuration shared by the command line and both drivers.

A config file is TOML with optional tables ``[cluster]``, ``[run]``, ``[cost]`` (cost-model
overrides, see ``rlsched.sim.cost``), ``[live]`` (live-backend settings) and ``[[policy]]``
entries (``spec = "NAME:key=value,..."``), and ``[faults]`` (fault injection in the simulator,
see ``rlsched.cluster.faults``). Unknown tables or keys are errors, so a typo
never silently falls back to a default.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .errors import ConfigError, did_you_mean, shown
from .faults import FaultSchedule, parse_faults


@dataclass(frozen=True, slots=True)
class RunConfig:
    """How big the cluster is and what each step draws from the trace."""

    gpus: int = 64  # GPU slots in the cluster
    tp: int = 4  # GPUs per inference engine (tensor-parallel size)
    steps: int = 4  # optimizer steps to run
    tasks_per_step: int | None = None  # None: all tasks of the trace / steps
    samples_per_task: int | None = None  # None: every trajectory of a task in the trace
    seed: int = 0
    sandbox_slots: int = 4096  # concurrent tool calls (CPU sandboxes); queue when full
    processor: bool = False  # train through the trajectory processor (prefix sharing)
    check: bool = False  # check invariants at run time (slower)
    faults: FaultSchedule | None = None  # the [faults] table (simulator only)

    def __post_init__(self) -> None:
        for name in ("gpus", "tp", "steps", "sandbox_slots"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"run config: {name}={v!r}: expected an integer >= 1")
        for name in ("tasks_per_step", "samples_per_task"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"run config: {name}={v!r}: expected an integer >= 1")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"run config: seed={shown(self.seed)}: expected an integer >= 0")
        for name in ("processor", "check"):
            v = getattr(self, name)
            if not isinstance(v, bool):
                raise ConfigError(f"run config: {name}={shown(v)}: expected true or false")
        if self.faults is not None and not isinstance(self.faults, FaultSchedule):
            raise ConfigError("run config: faults: expected the [faults] table (a FaultSchedule)")
        if self.gpus % self.tp:
            raise ConfigError(
                f"run config: gpus={self.gpus} is not a multiple of tp={self.tp} "
                "(engines are tp GPUs each)"
            )
        if self.gpus // self.tp < 2:
            raise ConfigError(
                f"run config: gpus={self.gpus}, tp={self.tp} gives one engine; "
                "need at least two engine groups so rollout and training can be split"
            )

    def with_overrides(self, **kw: Any) -> RunConfig:
        return replace(self, **{k: v for k, v in kw.items() if v is not None})


@dataclass(frozen=True, slots=True)
class ConfigFile:
    """A parsed config file: run settings, cost overrides, policy specs, live settings."""

    run: RunConfig = field(default_factory=RunConfig)
    cost: dict[str, Any] = field(default_factory=dict)
    policies: tuple[str, ...] = ()
    live: dict[str, Any] = field(default_factory=dict)
    trace: str | None = None
    source: str = "<defaults>"


_RUN_KEYS = {f.name for f in fields(RunConfig)} - {"faults"}
_SECTIONS = {"cluster", "run", "cost", "policy", "live", "trace", "faults"}


def load_config(path: str | Path) -> ConfigFile:
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read config ({exc.__class__.__name__})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{p}: not a usable config: values are nested too deeply") from None
    except ValueError as exc:  # e.g. an integer past Python's 4300-digit conversion limit
        raise ConfigError(f"{p}: not a usable config: {str(exc).splitlines()[0]}") from None
    return parse_config(data, source=str(p))


def parse_config(data: dict[str, Any], source: str = "<config>") -> ConfigFile:
    for key in data:
        if key not in _SECTIONS:
            raise ConfigError(f"{source}: unknown section {key!r}{did_you_mean(key, _SECTIONS)}")
    run_kw: dict[str, Any] = {}
    for section in ("cluster", "run"):
        table = data.get(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [{section}] must be a table")
        for k, v in table.items():
            if k not in _RUN_KEYS:
                raise ConfigError(f"{source}: [{section}] unknown key {k!r}{did_you_mean(k, _RUN_KEYS)}")
            run_kw[k] = v
    if "faults" in data:
        run_kw["faults"] = parse_faults(data["faults"], source)
    run = RunConfig(**run_kw)
    cost = data.get("cost", {})
    if not isinstance(cost, dict):
        raise ConfigError(f"{source}: [cost] must be a table")
    pols = data.get("policy", [])
    if isinstance(pols, dict):
        pols = [pols]
    if not isinstance(pols, list):
        raise ConfigError(f"{source}: policy must be [[policy]] entries with spec = \"NAME:key=value,...\"")
    specs: list[str] = []
    for i, entry in enumerate(pols):
        if not isinstance(entry, dict) or not isinstance(entry.get("spec"), str):
            raise ConfigError(f"{source}: [[policy]] entry {i} needs spec = \"NAME:key=value,...\"")
        extra = set(entry) - {"spec"}
        if extra:
            raise ConfigError(f"{source}: [[policy]] entry {i}: unknown key {sorted(extra)[0]!r}")
        specs.append(entry["spec"])
    live = data.get("live", {})
    if not isinstance(live, dict):
        raise ConfigError(f"{source}: [live] must be a table")
    trace = data.get("trace")
    if trace is not None and not isinstance(trace, str):
        raise ConfigError(f"{source}: trace must be a path string")
    return ConfigFile(run, dict(cost), tuple(specs), dict(live), trace, source)
