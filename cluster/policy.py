"""The Policy protocol: events in, commands out.

A policy is pure: no I/O, no clocks, no randomness except the ``random.Random`` it is given
in :meth:`Policy.reset`. It never learns which driver runs it. The same object, with the
same parameters, runs in the simulator and on the live backend.

Policies declare their tunable parameters (:class:`Param`) so specs can be parsed and
validated uniformly and the planner can search them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from .commands import Command
from .events import Event
from .view import ClusterView


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
    bound the analysis can prove for it.
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
