"""The planner's search space, derived from what each policy declares (its ``Param``s).

A policy's *non-tunable* parameters (a staleness bound, a mode that changes semantics) are
not searched: they are enumerated over their allowed values, and each combination whose
promised staleness fits the user's bound becomes one **arm** (``async:staleness=1``). The
*tunable* parameters of an arm are the optimiser's dimensions, named ``<arm>.<param>`` so
each arm learns its own values (the best ``rollout_fraction`` differs with staleness).

Declared ranges are meant for validation, not search, so two rules turn them into
searchable ones: integer ranges are clamped to the cluster's number of engine groups
(``gpus // tp``: the counts scheduling policies take -- engines to keep, groups to move --
mean nothing beyond it), and ranges spanning more than two decades are
searched on a log scale (a 0..1e7 s time budget would otherwise be sampled almost only at
values no run ever reaches); a range from 0 whose default is 0 ("no limit") becomes an
on/off choice plus a log-scale value when on. Floats are rounded to three significant digits when written
into a spec, so recommended specs stay readable.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Literal

from rlsched.cluster.errors import ConfigError
from rlsched.cluster.policy import Param
from rlsched.policies import available, canonical_spec, get_policy_class, make_policy

_MAX_ENUMERATED = 16  # an int non-tunable with a wider range keeps its default
_MAX_ARMS = 64
_LOG_RATIO = 100.0


@dataclass(frozen=True)
class Dim:
    """One searched dimension of an arm."""

    param: str
    kind: Literal["int", "float", "bool", "choice"]
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    choices: tuple[Any, ...] = ()
    optional: bool = False  # 0 means "off": searched as off, or on with a log-scale value


@dataclass(frozen=True)
class Arm:
    """A policy with its non-tunable parameters fixed, and its searched dimensions."""

    policy: str
    fixed: tuple[tuple[str, Any], ...]
    dims: tuple[Dim, ...]
    staleness: int  # the staleness bound the policy promises with these fixed values

    @property
    def key(self) -> str:
        if not self.fixed:
            return self.policy
        return self.policy + ":" + ",".join(f"{k}={_fmt(v)}" for k, v in self.fixed)

    def spec(self, values: dict[str, Any]) -> str:
        """The canonical spec of this arm with ``values`` for (some of) its dimensions."""
        parts = [f"{k}={_fmt(v)}" for k, v in self.fixed]
        parts += [f"{k}={_fmt(v)}" for k, v in values.items()]
        text = self.policy + (":" + ",".join(parts) if parts else "")
        return canonical_spec(make_policy(text))

    def defaults(self) -> dict[str, Any]:
        """Each dimension at the policy's declared default (the first trial of the arm)."""
        declared = {p.name: p.default for p in get_policy_class(self.policy).params}
        return {d.param: declared[d.param] for d in self.dims}


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.3g}" if value == value else "nan"
    return str(value)


def round_value(dim: Dim, value: Any) -> Any:
    """The value as it goes into a spec: floats to 3 significant digits, within range."""
    if dim.kind == "float":
        v = float(f"{float(value):.3g}")
        return min(max(v, dim.low), dim.high)
    if dim.kind == "int":
        return int(value)
    return value


def _dim(p: Param, groups: int) -> Dim:
    if p.kind == "bool":
        return Dim(p.name, "bool", choices=(False, True))
    if p.kind == "choice":
        return Dim(p.name, "choice", choices=tuple(p.choices))
    low = float(p.low) if p.low is not None else 0.0
    high = float(p.high) if p.high is not None else max(1.0, 2 * abs(low))
    if p.kind == "int":
        low, high = math.ceil(low), math.floor(high)
        high = max(low, min(high, groups))
        log = low >= 1 and high / low >= _LOG_RATIO / 4
        return Dim(p.name, "int", low, high, log)
    if low > 0 and high / low >= _LOG_RATIO:
        return Dim(p.name, "float", low, high, True)
    if low == 0 and high >= 1000:  # e.g. a budget in seconds: decades matter, not units
        return Dim(p.name, "float", high * 1e-6, high, True, optional=p.default == 0)
    return Dim(p.name, "float", low, high, False)


def _enumerated(p: Param) -> list[Any]:
    if p.kind == "bool":
        return [False, True]
    if p.kind == "choice":
        return list(p.choices)
    if p.kind == "int" and p.low is not None and p.high is not None and p.high - p.low < _MAX_ENUMERATED:
        return list(range(int(p.low), int(p.high) + 1))
    return [p.default]


def build_arms(policies: tuple[str, ...] | None, max_staleness: int, groups: int) -> list[Arm]:
    """Every arm of the named policies (default: all registered) within ``max_staleness``;
    ``groups`` is the cluster's number of engine groups (``gpus // tp``)."""
    if max_staleness < 0:
        raise ConfigError(f"--max-staleness={max_staleness}: expected an integer >= 0")
    # (each name once: --policies colocated,colocated made two arms of one spec, and the
    # search, waiting for a trial per arm, never stopped)
    names = list(dict.fromkeys(policies)) if policies else list(available())
    arms: list[Arm] = []
    for name in names:
        cls = get_policy_class(name)
        fixed_params = [p for p in cls.params if not p.tunable]
        dims = tuple(_dim(p, groups) for p in cls.params if p.tunable)
        for combo in itertools.product(*(_enumerated(p) for p in fixed_params)):
            fixed = tuple((p.name, v) for p, v in zip(fixed_params, combo, strict=True))
            spec = name + (":" + ",".join(f"{k}={_fmt(v)}" for k, v in fixed) if fixed else "")
            promised = make_policy(spec).max_staleness
            if promised <= max_staleness:
                arms.append(Arm(name, fixed, dims, promised))
    if not arms:
        raise ConfigError(
            f"no policy configuration of {', '.join(names)} keeps staleness <= {max_staleness}"
        )
    if len(arms) > _MAX_ARMS:
        raise ConfigError(
            f"{len(arms)} policy configurations to search (more than {_MAX_ARMS}); "
            "narrow them with --policies or --max-staleness"
        )
    return arms


def suggest(trial: Any, arms: list[Arm]) -> tuple[Arm, dict[str, Any]]:
    """Ask an Optuna trial for an arm and its values (define-by-run: conditional space)."""
    by_key = {a.key: a for a in arms}
    arm = by_key[trial.suggest_categorical("arm", list(by_key))]
    values: dict[str, Any] = {}
    for d in arm.dims:
        name = f"{arm.key}.{d.param}"
        if d.kind in ("bool", "choice"):
            raw = trial.suggest_categorical(name, list(d.choices))
        elif d.kind == "int":
            raw = trial.suggest_int(name, int(d.low), int(d.high), log=d.log)
        elif d.optional and not trial.suggest_categorical(f"{name}:on", [False, True]):
            raw = 0.0
        else:
            raw = trial.suggest_float(name, d.low, d.high, log=d.log)
        values[d.param] = raw if raw == 0.0 and d.optional else round_value(d, raw)
    return arm, values


def enqueue_params(arm: Arm) -> dict[str, Any]:
    """Optuna parameters that make a trial run ``arm`` at its declared defaults (clipped
    into the searched range; an optional limit whose default is 0 is switched off)."""
    out: dict[str, Any] = {"arm": arm.key}
    for d, (k, v) in zip(arm.dims, arm.defaults().items(), strict=True):
        if d.optional and v == 0:
            out[f"{arm.key}.{k}:on"] = False
            continue
        if d.kind in ("int", "float"):
            v = min(max(v, d.low), d.high)
            v = int(v) if d.kind == "int" else float(v)
        out[f"{arm.key}.{k}"] = v
    return out
