"""Run configuration shared by the command line and both drivers: the records
(:class:`RunConfig`, :class:`LoggingConfig`) and their own checks.

Reading a config file and merging its sections into these records is the composition
root's job (:mod:`rlsched.config`); nothing below the command line reads files.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .errors import ConfigError, did_you_mean, shown
from .faults import FaultSchedule

#: The most GPUs (and sandbox slots) a run may name: far beyond any cluster, and small enough
#: for the per-GPU state a run keeps (``--gpus 99999999999999999996`` was an OverflowError).
MAX_SLOTS = 1 << 20
#: The largest config or cost-model file read: far above any real one (a few kB), small
#: enough that ``--config /dev/zero`` stops at once instead of reading until memory runs out.
MAX_CONFIG_BYTES = 16 << 20


def read_config_text(path: str | Path) -> str:
    """A config or cost file's text, refusing one past :data:`MAX_CONFIG_BYTES` (``OSError``
    and ``UnicodeDecodeError`` are the caller's to word, as for ``Path.read_text``)."""
    with open(path, "rb") as fh:
        raw = fh.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: more than {MAX_CONFIG_BYTES >> 20} MiB: expected a TOML "
                          "(or JSON) settings file of a few kB")
    return raw.decode("utf-8")


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
        for name in ("gpus", "sandbox_slots"):  # (the cluster state holds one slot per GPU)
            if getattr(self, name) > MAX_SLOTS:
                raise ConfigError(f"run config: {name}={getattr(self, name)}: expected at most {MAX_SLOTS:,}")
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
