"""Timer events scheduled on SimPy's event queue through its public API (the simulator's
hottest path).

``Environment.step`` pops the earliest ``(time, priority, id, event)``, sets the clock,
sets ``event.callbacks`` to None, calls each callback with the event and then checks that
the event did not fail (SimPy's event protocol: a ``callbacks`` list and an ``_ok`` flag,
which :class:`simpy.events.Event` keeps and ``step`` reads; the simulator itself never
reads them). A timer therefore needs no ``simpy.Timeout`` and no closure: :class:`Call`
is the smallest object with that protocol, scheduled by one
``Environment.schedule(event, NORMAL, delay)`` call (``DriverCore._schedule``): the same
key ``Timeout`` gets, so ties still break in insertion order and runs stay deterministic.
Objects that are themselves timer events while none of theirs is pending (trajectories,
engines) follow the same protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simpy.events import NORMAL

__all__ = ["NORMAL", "Call"]


class Call:
    """A scheduled call ``fn(a, b)`` (or data for a dedicated callback)."""

    __slots__ = ("a", "b", "callbacks", "due", "fn")
    _ok = True  # (SimPy's event protocol: it never fails; read by Environment.step only)

    def __init__(self, callbacks: tuple, fn: Callable[[Any, Any], None] | None, a: Any, b: Any) -> None:
        self.callbacks = callbacks
        self.fn = fn
        self.a = a
        self.b = b
        self.due = 0.0  # the time it fires (set by DriverCore._schedule)

