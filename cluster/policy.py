"""The Policy protocol: events in, commands out.

A policy is pure: no I/O, no clocks, no randomness except the ``random.Random`` it is given
in :meth:`Policy.reset`. It never learns which driver runs it. The same object, with the
same parameters, runs in the simulator and on the live backend.

Policies declare their tunable parameters (:class:`Param`) so specs can be parsed and
validated uniformly and the planner can search them. A policy declares each parameter once,
as a field of a frozen config dataclass made with :func:`param`, and derives from
:class:`Configured`, which turns the fields into ``params`` and the constructor's keywords
into ``self.config`` (see :func:`param_values` for the older style, one attribute each).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from .commands import Command
from .events import Event
from .view import ClusterView

# A parameter's value written in a spec: ASCII digits, a sign, a point and an exponent only.
_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[+-]?(inf|infinity|nan)", re.ASCII | re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Param:
    """One tunable parameter of a policy.

    ``kind`` is ``int``, ``float``, ``bool`` or ``choice``. ``low``/``high`` bound numeric
    values (inclusive); ``choices`` lists the values of a ``choice``. ``tunable`` says
    whether a planner should search it (a budget or a switch that changes the semantics,
    such as a staleness bound, may be fixed by the user instead).
    """

    name: str
    kind: Literal["int", "float", "bool", "choice"]
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    tunable: bool = True

    def parse(self, raw: str | Any, *, policy: str) -> Any:
        """Convert and range-check a value; raise ValueError with one readable line."""
        where = f"{policy}: parameter {self.name}"
        if self.kind == "bool":
            if isinstance(raw, bool):
                return raw
            s = str(raw).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"{where}={raw!r}: expected true or false")
        if self.kind == "choice":
            s = str(raw)
            if s not in self.choices:
                raise ValueError(f"{where}={raw!r}: expected one of {', '.join(self.choices)}")
            return s
        try:
            if isinstance(raw, str) and not (_INT if self.kind == "int" else _FLOAT).fullmatch(raw.strip()):
                # (Python's int() and float() also read "1_0" as 10 and other scripts' digits,
                # "٣" as 3: a spec is ASCII, and such a value a typo or an attack)
                raise ValueError
            if self.kind == "int":
                if isinstance(raw, float) and not raw.is_integer():
                    raise ValueError
                value: float = int(str(raw)) if not isinstance(raw, int | float) else int(raw)
            else:
                value = float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"{where}={raw!r}: expected {self.kind}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{where}={raw!r}: expected a finite {self.kind}")
        if self.low is not None and value < self.low:
            raise ValueError(f"{where}={raw!r}: must be >= {self.low:g}")
        if self.high is not None and value > self.high:
            raise ValueError(f"{where}={raw!r}: must be <= {self.high:g}")
        return value


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy.

    ``name`` is its registry name; ``params`` declares its parameters (constructor keyword
    arguments of the same names); ``max_staleness`` is the staleness bound it promises
    (drivers reject a ``Train`` that would exceed it); ``defers`` is True when a trajectory
    of step s may be trained in a later step (partial rollout), which weakens the lower
    bound the analysis can prove for it. A policy that does not defer trains step s's batch
    at version s only: drivers reject a ``Train``/``TrainMicroBatch`` off it.
    """

    name: ClassVar[str]
    params: ClassVar[tuple[Param, ...]]

    @property
    def max_staleness(self) -> int: ...

    @property
    def defers(self) -> bool: ...

    def reset(self, view: ClusterView, rng: random.Random) -> None:
        """Called once before ``RunStarted``; forget everything from a previous run."""

    def on_event(self, event: Event, view: ClusterView) -> Sequence[Command]:
        """Answer one event with the commands to apply now (possibly none)."""
        ...


_PARAM = "rlsched.param"  # the dataclass field metadata key :func:`param` fills


def param(kind: Literal["int", "float", "bool", "choice"], default: Any, help: str, *,
          low: float | None = None, high: float | None = None, choices: tuple[str, ...] = (),
          tunable: bool = True) -> Any:
    """A field of a policy's config dataclass that is also one of its :class:`Param`s: the
    default is written here once, and :func:`params_of` derives the ``Param``."""
    spec = {"kind": kind, "help": help, "low": low, "high": high, "choices": choices, "tunable": tunable}
    return field(default=default, metadata={_PARAM: spec})


def params_of(config: type) -> tuple[Param, ...]:
    """The :class:`Param` of each field of ``config`` (a dataclass of :func:`param` fields),
    in field order."""
    out = []
    for f in fields(config):
        if _PARAM not in f.metadata or f.default is MISSING:
            raise TypeError(f"{config.__qualname__}.{f.name}: declare policy parameters with param(...)")
        out.append(Param(f.name, default=f.default, **f.metadata[_PARAM]))
    return tuple(out)


class Configured:
    """Base of a policy whose parameters are the fields of its ``Config``.

    ``Config`` is a frozen dataclass whose fields are made with :func:`param`; the subclass
    gets ``params`` from it, and ``Policy(**values)`` stores ``self.config = Config(**values)``
    (an unknown keyword is a ``TypeError``, as for any constructor). Construction sets up no
    run state: :meth:`Policy.reset` does that before every run."""

    Config: ClassVar[type]
    params: ClassVar[tuple[Param, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "Config" in cls.__dict__:
            cls.params = params_of(cls.Config)

    def __init__(self, **values: Any) -> None:
        self.config: Any = self.Config(**values)


def param_values(policy: Any) -> dict[str, Any]:
    """Each declared parameter's value in ``policy``: from its ``config`` (a
    :class:`Configured` policy), else from one attribute per parameter (the older style)."""
    params = type(policy).params
    config = getattr(policy, "config", None)
    source = config if config is not None and is_dataclass(config) else policy
    return {p.name: getattr(source, p.name) for p in params}
