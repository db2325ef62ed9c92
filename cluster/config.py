"""Run configuration shared by the command line and both drivers.

A config file is TOML with optional tables ``[cluster]``, ``[run]``, ``[cost]`` (cost-model
overrides, see ``rlsched.sim.cost``), ``[live]`` (live-backend settings) and ``[[policy]]``
entries (``spec = "NAME:key=value,..."``), ``[faults]`` (fault injection in the simulator,
see ``rlsched.cluster.faults``) and ``[logging]`` (where a live run streams its metrics:
TensorBoard event files, W&B offline). Unknown tables or keys are errors, so a typo
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


LOGGERS = ("tensorboard", "wandb", "none")


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    """The ``[logging]`` table: which dashboards a live run writes its metrics to.

    ``logger`` is a tuple of backend names (verl's ``trainer.logger`` list, without the
    console one: the progress bar is that); empty means none. ``dir`` is where the event
    files go (default: ``tensorboard/`` inside the run directory, so the run keeps them);
    ``project`` and ``name`` are W&B's (``name`` defaults to the run directory's name)."""

    logger: tuple[str, ...] = ()
    dir: str | None = None
    project: str = "rlsched"
    name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.logger, tuple) or not all(isinstance(x, str) for x in self.logger):
            raise ConfigError(f"[logging] logger={shown(self.logger)}: expected a list of names")
        for name in self.logger:
            if name not in LOGGERS:
                raise ConfigError(
                    f"[logging] logger: unknown logger {name!r}{did_you_mean(name, LOGGERS)}; "
                    f"expected one of {', '.join(LOGGERS)}"
                )
        for key in ("dir", "name"):
            v = getattr(self, key)
            if v is not None and (not isinstance(v, str) or not v):
                raise ConfigError(f"[logging] {key}={shown(v)}: expected a non-empty string")
        if not isinstance(self.project, str) or not self.project:
            raise ConfigError(f"[logging] project={shown(self.project)}: expected a non-empty string")

    @property
    def backends(self) -> tuple[str, ...]:
        """The loggers to open ("none" and repeats left out), in the order given."""
        return tuple(dict.fromkeys(x for x in self.logger if x != "none"))

    @classmethod
    def parse(cls, value: Any, source: str = "--logger") -> LoggingConfig:
        """``--logger``'s value: NAME or NAME,NAME (``none`` for no logger)."""
        if not isinstance(value, str):
            raise ConfigError(f"{source}: expected a logger name, got {shown(value)}")
        names = tuple(x.strip() for x in value.split(","))
        if any(not x for x in names):
            raise ConfigError(f"{source} {value!r}: empty name in the list; expected e.g. tensorboard or tensorboard,wandb")
        for name in names:
            if name not in LOGGERS:
                raise ConfigError(f"{source} {name!r}: unknown logger{did_you_mean(name, LOGGERS)}; "
                                  f"expected one of {', '.join(LOGGERS)}")
        return cls(logger=names)

    def as_dict(self) -> dict[str, Any]:
        return {"logger": list(self.logger), "dir": self.dir, "project": self.project, "name": self.name}


def parse_logging(table: Any, source: str) -> LoggingConfig:
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [logging] must be a table")
    known = {f.name for f in fields(LoggingConfig)}
    for k in table:
        if k not in known:
            raise ConfigError(f"{source}: [logging] unknown key {k!r}{did_you_mean(k, known)}")
    kw = dict(table)
    if "logger" in kw:
        v = kw["logger"]
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list):
            raise ConfigError(f"{source}: [logging] logger={shown(v)}: expected a name or a list of names")
        kw["logger"] = tuple(v)
    try:
        return LoggingConfig(**kw)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


@dataclass(frozen=True, slots=True)
class ConfigFile:
    """A parsed config file: run settings, cost overrides, policy specs, live settings."""

    run: RunConfig = field(default_factory=RunConfig)
    cost: dict[str, Any] = field(default_factory=dict)
    policies: tuple[str, ...] = ()
    live: dict[str, Any] = field(default_factory=dict)
    trace: str | None = None
    source: str = "<defaults>"
    logging: LoggingConfig = field(default_factory=LoggingConfig)


_RUN_KEYS = {f.name for f in fields(RunConfig)} - {"faults"}
_SECTIONS = {"cluster", "run", "cost", "policy", "live", "trace", "faults", "logging"}


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
    logging = parse_logging(data["logging"], source) if "logging" in data else LoggingConfig()
    return ConfigFile(run, dict(cost), tuple(specs), dict(live), trace, source, logging)
