"""Timers pushed straight onto SimPy's event queue (the simulator's hottest path).

SimPy processes an event by popping ``(time, priority, id, event)`` off
``Environment._queue``, setting ``event.callbacks`` to None, calling each callback with
the event and checking ``event._ok``. A timer therefore needs no ``simpy.Timeout`` and no
closure: :class:`Call` is the smallest object with that protocol, and
:func:`queue_of` returns the queue and id counter so a timer is one ``heappush`` of the
tuple ``Environment.schedule`` would push (same key: ties still break in insertion
order, so runs stay deterministic). Objects that are themselves timer events while none
of theirs is pending (trajectories, engines) follow the same protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import simpy
from simpy.events import NORMAL

__all__ = ["NORMAL", "Call", "queue_of"]


class Call:
    """A scheduled call ``fn(a, b)`` (or data for a dedicated callback)."""

    __slots__ = ("a", "b", "callbacks", "fn")
    _ok = True

    def __init__(self, callbacks: tuple, fn: Callable[[Any, Any], None] | None, a: Any, b: Any) -> None:
        self.callbacks = callbacks
        self.fn = fn
        self.a = a
        self.b = b


def queue_of(env: simpy.Environment) -> tuple[list, Iterator[int]]:
    """The environment's event heap and insertion-id counter (what ``schedule`` uses)."""
    queue, eid = getattr(env, "_queue", None), getattr(env, "_eid", None)
    if not isinstance(queue, list) or eid is None or not isinstance(getattr(env, "_now", None), float | int):
        raise RuntimeError(f"simpy {simpy.__version__}: Environment has no _queue/_eid/_now; "
                           "rlsched's timers need SimPy 4")
    return queue, eid
