"""Config files: reading a TOML file and merging its sections into the run's records.

A config file is TOML with optional tables ``[cluster]``, ``[run]``, ``[cost]`` (cost-model
overrides, see ``rlsched.sim.cost``), ``[live]`` (live-backend settings) and ``[[policy]]``
entries (``spec = "NAME:key=value,..."``), ``[faults]`` (fault injection in the simulator,
see ``rlsched.cluster.faults``) and ``[logging]`` (where a live run streams its metrics:
TensorBoard event files, W&B offline). Unknown tables or keys are errors, so a typo
never silently falls back to a default.

This is the composition root's part; the records it fills (:class:`RunConfig`,
:class:`LoggingConfig`) live in :mod:`rlsched.cluster.config`, below both drivers.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from rlsched.cluster.config import LoggingConfig, RunConfig, read_config_text
from rlsched.cluster.errors import ConfigError, did_you_mean, shown
from rlsched.cluster.faults import parse_faults
from rlsched.real.config import LiveSettings


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
#: Sections of other rlsched files, and where such a file goes (a cost-model file given as
#: --config failed as an unknown section, with no word on where it belongs).
_FOREIGN_SECTIONS = {"calibration": ": a cost-model file from `rlsched calibrate`? give it as --cost"}


def load_config(path: str | Path) -> ConfigFile:
    p = Path(path)
    try:
        data = tomllib.loads(read_config_text(p))
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
            hint = _FOREIGN_SECTIONS.get(key) or did_you_mean(key, _SECTIONS)
            raise ConfigError(f"{source}: unknown section {key!r}{hint}")
    run_kw: dict[str, Any] = {}
    for section in ("cluster", "run"):
        table = data.get(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [{section}] must be a table")
        for k, v in table.items():
            if k not in _RUN_KEYS:
                raise ConfigError(f"{source}: [{section}] unknown key {k!r}{did_you_mean(k, _RUN_KEYS)}")
            if k in run_kw:  # (one silently won over the other)
                raise ConfigError(f"{source}: {k} is set in both [cluster] and [run]: keep one")
            run_kw[k] = v
    if "faults" in data:
        run_kw["faults"] = parse_faults(data["faults"], source)
    try:
        run = RunConfig(**run_kw)
    except ConfigError as exc:  # (it names the field; this names the file too)
        raise ConfigError(f"{source}: {exc}") from None
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
        _check_spec(entry["spec"], source, i)
        specs.append(entry["spec"])
    live = data.get("live", {})
    if not isinstance(live, dict):
        raise ConfigError(f"{source}: [live] must be a table")
    _check_live_keys(live, source)
    trace = data.get("trace")
    if trace is not None and (not isinstance(trace, str) or not trace.strip()):
        # (an empty one resolved to the config's own folder: "'.': is a directory")
        raise ConfigError(f"{source}: trace={shown(trace)}: expected the path of a trace file")
    logging = parse_logging(data["logging"], source) if "logging" in data else LoggingConfig()
    return ConfigFile(run, dict(cost), tuple(specs), dict(live), trace, source, logging)


def _check_live_keys(live: dict[str, Any], source: str) -> None:
    """Refuse an unknown ``[live]`` key when the file is read, as every other table does:
    a simulated run never builds the live settings, so a typo there went unnoticed until
    the same file was run live (and the value meant was silently the default until then)."""
    known = {f.name for f in fields(LiveSettings)}
    for k in live:
        if k not in known:
            raise ConfigError(f"{source}: [live] unknown key {k!r}{did_you_mean(k, known)}")
    # Its values too (LiveSettings is plain data, no live dependency): a wrong one -- a
    # string for an integer, temperature = -1 or nan -- was carried by compare and plan
    # (into recommended.toml) and refused only when the file was finally run live.
    try:
        LiveSettings.from_config(live)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _check_spec(spec: str, source: str, i: int) -> None:
    """A [[policy]] spec is checked when the file is read, whichever command reads it (a bad
    one was silently ignored when --policy took its place)."""
    from rlsched.cluster.errors import PolicyError
    from rlsched.policies import make_policy

    try:
        make_policy(spec)
    except (PolicyError, ConfigError) as exc:
        raise ConfigError(f"{source}: [[policy]] entry {i}: {exc}") from None
