"""The policy registry: names -> classes, specs -> configured policy objects.

A spec is ``NAME`` or ``NAME:key=value,key=value``; ``NAME:`` with nothing after the colon
is refused like any other malformed spec. Names are unique: registering a
second class under a taken name is an error, never a silent overwrite. Third-party
policies register through the ``rlsched.policies`` entry-point group (each entry point
names a policy class) and are loaded on first lookup, each wrapped so that its defects end
in one line naming it (:mod:`.plugins`).
"""

from __future__ import annotations

import difflib
from importlib.metadata import entry_points
from typing import Any

from rlsched.cluster.errors import PolicyError, shown
from rlsched.cluster.policy import Param, Policy, param_values

from .plugins import PluginError, exception_line, guarded, params_defect

_REGISTRY: dict[str, type] = {}
_ENTRY_POINTS_LOADED = False
ENTRY_POINT_GROUP = "rlsched.policies"


def register(cls: type) -> type:
    """Class decorator: add a policy class under ``cls.name``."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise PolicyError(f"{getattr(cls, '__qualname__', shown(cls))} has no `name` class attribute")
    defect = params_defect(getattr(cls, "params", None))
    if defect:
        raise PolicyError(f"policy {name}: {defect}")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise PolicyError(
            f"policy name {name!r} is already registered by {_REGISTRY[name].__module__}."
            f"{_REGISTRY[name].__qualname__}"
        )
    _REGISTRY[name] = cls
    return cls


def _load_entry_points() -> None:
    """Import each plugin and register it wrapped by :func:`~.plugins.guarded`. A plugin that
    fails to import or declares its parameters wrongly stops the lookup with one
    :class:`~.plugins.PluginError` line (never silently skipped)."""
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        who = f"policy plugin {ep.name!r} ({ep.value})"
        before = dict(_REGISTRY)
        try:
            cls = ep.load()
        except Exception as exc:  # a broken plugin must not take the CLI down silently
            raise PluginError(ep.name, f"{who} failed to load: {exc}") from None
        # the entry point's class, and any class its module registered itself on import (a
        # class registered before, such as a shipped one an entry point names, stays as it is)
        own = [c for n, c in _REGISTRY.items() if before.get(n) is not c]
        if cls not in own and cls not in before.values():
            own.append(cls)
        for c in own:
            name = getattr(c, "name", None)
            if isinstance(name, str) and _REGISTRY.get(name) is c:
                del _REGISTRY[name]  # (registered by its module: registered again, guarded)
            defect = params_defect(getattr(c, "params", None))
            if defect:
                raise PluginError(ep.name, f"{who}: {defect}")
            try:
                register(guarded(c, who) if isinstance(c, type) else c)
            except PolicyError as err:
                raise PluginError(ep.name, f"{who}: {err}") from None
            except Exception as exc:  # e.g. a class that refuses to be subclassed
                raise PluginError(ep.name, f"{who}: not a usable policy class: {exception_line(exc)}") from None


def available() -> dict[str, type]:
    _load_entry_points()
    return dict(sorted(_REGISTRY.items()))


def get_policy_class(name: str) -> type:
    reg = available()
    if name not in reg:
        near = difflib.get_close_matches(name, reg, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise PolicyError(f"unknown policy {name!r}{hint}; available: {', '.join(reg)}")
    return reg[name]


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``NAME:key=value,...`` into the name and raw string values."""
    spec = spec.strip()
    name, sep, rest = spec.partition(":")
    name = name.strip()
    if not name:
        raise PolicyError(f"policy spec {spec!r}: expected NAME or NAME:key=value,...")
    raw: dict[str, str] = {}
    if sep and not rest.strip():
        # "async:" reads as a parameter list that was meant and then lost (a shell variable
        # that expanded to nothing); refusing it is safer than running the defaults.
        shown = name if name.isprintable() else repr(name)[1:-1]  # (an error is one line)
        raise PolicyError(f"policy spec {spec!r}: empty parameter list after ':' — expected "
                          f"{shown} or {shown}:key=value,...")
    if sep:
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or not key or not value.strip():
                raise PolicyError(f"policy spec {spec!r}: {item.strip()!r} is not key=value")
            if key in raw:
                raise PolicyError(f"policy spec {spec!r}: parameter {key!r} given twice")
            raw[key] = value.strip()
    return name, raw


def resolve_params(cls: type, raw: dict[str, Any]) -> dict[str, Any]:
    """Convert raw values with the class's declared Params; fill defaults."""
    params: dict[str, Param] = {p.name: p for p in cls.params}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in params:
            near = difflib.get_close_matches(key, params, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            known = ", ".join(params) or "none"
            raise PolicyError(f"policy {cls.name}: unknown parameter {key!r}{hint}; parameters: {known}")
        try:
            out[key] = params[key].parse(value, policy=cls.name)
        except ValueError as err:
            raise PolicyError(str(err)) from None
    for p in cls.params:
        out.setdefault(p.name, p.default)
    return out


def make_policy(spec: str) -> Policy:
    """Build a configured policy object from a spec string."""
    name, raw = parse_spec(spec)
    cls = get_policy_class(name)
    return cls(**resolve_params(cls, raw))


def canonical_spec(policy: Policy) -> str:
    """``NAME:key=value,...`` with every parameter, so a record says exactly what ran."""
    values = ",".join(f"{k}={v}" for k, v in param_values(policy).items())
    return f"{policy.name}:{values}" if values else policy.name


def make_policy_and_spec(spec: str) -> tuple[Policy, str]:
    """The policy of ``spec`` and its canonical spec: the factory a composition root hands
    a driver that must build a policy itself (a live run resumed from its checkpoint)."""
    policy = make_policy(spec)
    return policy, canonical_spec(policy)
