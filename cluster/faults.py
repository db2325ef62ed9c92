"""Fault schedules: which failures a simulated run injects, and when.

A schedule is part of a run's configuration (the ``[faults]`` table of a config file, or
``simulate(..., faults=...)``), so a run with faults is as reproducible as one without:
the same schedule and seed fire the same faults at the same simulated times.

Four kinds of fault, each an event the policies see (:mod:`rlsched.cluster.events`):

``gpu``
    A GPU fails (``WorkerFailed``). Its engine, if it had one, is gone: the engine's
    in-flight trajectories stop, keeping their finished turns, and the policy dispatches
    them again elsewhere. A trainer GPU's failure loses the current optimizer step's
    gradients: the trainer re-runs the step from the last completed optimizer step.
    The GPU is unusable for ``recover_s`` seconds, then ``WorkerRecovered``.
``trainer``
    The training job crashes (``TrainerFailed``): the current step's finished
    micro-batches are lost and re-run after ``restart_s`` seconds.
``tool``
    A tool call hangs: it is cut at ``tool_timeout_s`` seconds (``ToolTimedOut``) and the
    trajectory continues with the timeout as the call's result. Which call: the next one
    to start at or after the fault time (of ``trajectory``, if given).
``sync``
    A weight sync fails (``SyncFailed``): the engines keep their old weights, and the
    sync is retried after ``sync_retry_s`` seconds. Which sync: the next one to end at or
    after the fault time.

A fault is either *explicit* (``at`` seconds) or a *rate* (``per_hour``: a Poisson process
drawn from the schedule's own seeded RNG; a rate GPU fault picks a working GPU at random).

TOML::

    [faults]
    seed = 7              # RNG of rate faults and of GPU picks (default 0)
    recover_s = 600       # a failed GPU is back after this long (default 600)
    restart_s = 60        # trainer restart after a trainer fault (default 60)
    tool_timeout_s = 300  # a hung tool call is cut here (default 300)
    sync_retry_s = 30     # a failed weight sync is retried after this long (default 30)

    [[faults.fault]]
    kind = "gpu"
    at = 1200.0
    gpu = 3               # optional: default, a random working GPU

    [[faults.fault]]
    kind = "gpu"
    per_hour = 1.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, did_you_mean, shown

KINDS = ("gpu", "trainer", "tool", "sync")
# Longest duration a schedule may give (recover_s, restart_s, tool_timeout_s, sync_retry_s):
# about 32 years, longer than any run. A larger value is a typo or a stand-in for "never",
# and near float's limit the run's times overflow to inf (restart_s = 1e308 made the
# report's plots fail on an infinite axis).
MAX_SECONDS = 1e9
_TOP_KEYS = {"seed", "recover_s", "restart_s", "tool_timeout_s", "sync_retry_s", "fault"}
_FAULT_KEYS = {"kind", "at", "per_hour", "gpu", "trajectory", "recover_s"}


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault: explicit (``at`` seconds) or a rate (``per_hour``); never both.

    ``gpu`` (kind gpu, explicit only) names the GPU; ``trajectory`` (kind tool, explicit
    only) names whose next tool call hangs; ``recover_s`` (kind gpu) overrides the
    schedule's recovery time for this fault.
    """

    kind: str
    at: float | None = None
    per_hour: float | None = None
    gpu: int | None = None
    trajectory: str | None = None
    recover_s: float | None = None

    def __post_init__(self) -> None:
        where = f"faults: fault {self.kind!r}"
        if self.kind not in KINDS:
            raise ConfigError(f"faults: kind={shown(self.kind)}: expected one of {', '.join(KINDS)}")
        if (self.at is None) == (self.per_hour is None):
            raise ConfigError(f"{where}: give exactly one of at (seconds) or per_hour (rate)")
        if self.at is not None:
            _check_number(f"{where}: at", self.at, low=0.0)
        if self.per_hour is not None:
            _check_number(f"{where}: per_hour", self.per_hour, low=0.0, positive=True)
        if self.gpu is not None:
            if self.kind != "gpu" or self.at is None:
                raise ConfigError(f"{where}: gpu= only applies to an explicit (at=) gpu fault")
            if isinstance(self.gpu, bool) or not isinstance(self.gpu, int) or self.gpu < 0:
                raise ConfigError(f"{where}: gpu={shown(self.gpu)}: expected a GPU index >= 0")
        if self.trajectory is not None:
            if self.kind != "tool" or self.at is None:
                raise ConfigError(f"{where}: trajectory= only applies to an explicit (at=) tool fault")
            if not isinstance(self.trajectory, str) or not self.trajectory:
                raise ConfigError(f"{where}: trajectory={shown(self.trajectory)}: expected a trajectory id")
        if self.recover_s is not None:
            if self.kind != "gpu":
                raise ConfigError(f"{where}: recover_s= only applies to a gpu fault")
            _check_number(f"{where}: recover_s", self.recover_s, low=0.0, positive=True, high=MAX_SECONDS)


@dataclass(frozen=True, slots=True)
class FaultSchedule:
    """The faults of one run plus the constants that say how long each one costs."""

    faults: tuple[Fault, ...] = ()
    seed: int = 0
    recover_s: float = 600.0
    restart_s: float = 60.0
    tool_timeout_s: float = 300.0
    sync_retry_s: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.faults, tuple) or not all(isinstance(f, Fault) for f in self.faults):
            raise ConfigError("faults: faults must be a tuple of Fault")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"faults: seed={shown(self.seed)}: expected an integer >= 0")
        _check_number("faults: recover_s", self.recover_s, low=0.0, positive=True, high=MAX_SECONDS)
        _check_number("faults: restart_s", self.restart_s, low=0.0, high=MAX_SECONDS)
        _check_number("faults: tool_timeout_s", self.tool_timeout_s, low=0.0, positive=True, high=MAX_SECONDS)
        _check_number("faults: sync_retry_s", self.sync_retry_s, low=0.0, high=MAX_SECONDS)

    def __bool__(self) -> bool:
        return bool(self.faults)

    def check_gpus(self, num_gpus: int) -> None:
        """Explicit GPU targets must exist in the cluster the run uses."""
        for f in self.faults:
            if f.gpu is not None and f.gpu >= num_gpus:
                raise ConfigError(
                    f"faults: fault 'gpu' at={f.at:g}: gpu={f.gpu}: the cluster has GPUs 0..{num_gpus - 1}"
                )

    def to_dict(self) -> dict[str, Any]:
        """Plain values for the run record's meta.json."""
        return {
            "seed": self.seed, "recover_s": self.recover_s, "restart_s": self.restart_s,
            "tool_timeout_s": self.tool_timeout_s, "sync_retry_s": self.sync_retry_s,
            "fault": [
                {k: v for k, v in (("kind", f.kind), ("at", f.at), ("per_hour", f.per_hour),
                                   ("gpu", f.gpu), ("trajectory", f.trajectory),
                                   ("recover_s", f.recover_s)) if v is not None}
                for f in self.faults
            ],
        }


def parse_faults(table: Any, source: str = "<config>") -> FaultSchedule:
    """The ``[faults]`` table of a config file; any mistake is one ConfigError line."""
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [faults] must be a table")
    for k in table:
        if k not in _TOP_KEYS:
            raise ConfigError(f"{source}: [faults] unknown key {k!r}{did_you_mean(k, _TOP_KEYS)}")
    entries = table.get("fault", [])
    if isinstance(entries, dict):
        entries = [entries]
    if not isinstance(entries, list):
        raise ConfigError(f"{source}: faults.fault must be [[faults.fault]] entries")
    faults = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ConfigError(f"{source}: [[faults.fault]] entry {i} must be a table")
        for k in entry:
            if k not in _FAULT_KEYS:
                raise ConfigError(f"{source}: [[faults.fault]] entry {i}: unknown key {k!r}{did_you_mean(k, _FAULT_KEYS)}")
        if "kind" not in entry:
            raise ConfigError(f"{source}: [[faults.fault]] entry {i}: needs kind = one of {', '.join(KINDS)}")
        try:
            faults.append(Fault(**entry))
        except ConfigError as exc:
            raise ConfigError(f"{source}: [[faults.fault]] entry {i}: {str(exc).removeprefix('faults: ')}") from None
    top = {k: v for k, v in table.items() if k != "fault"}
    try:
        return FaultSchedule(tuple(faults), **top)
    except ConfigError as exc:
        raise ConfigError(f"{source}: [faults] {str(exc).removeprefix('faults: ')}") from None


def _check_number(where: str, v: Any, *, low: float, positive: bool = False,
                  high: float | None = None) -> None:
    """A finite number in range, or one ConfigError line saying what is expected."""
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or v < low or (positive and v <= 0) or (high is not None and v > high):
        want = "a finite number > 0" if positive else f"a finite number >= {low:g}"
        if high is not None:
            want += f" and at most {high:g} seconds (about {high / 3.156e7:.0f} years)"
        raise ConfigError(f"{where}={shown(v)}: expected {want}")
