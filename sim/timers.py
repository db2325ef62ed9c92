"""The simulator's SimPy environment and its timer events (the simulator's hottest path).

:class:`SimEnvironment` is a ``simpy.Environment`` whose event queue is its own public
``heap`` (and ``ids`` counter and ``clock``): it overrides SimPy's public ``now``,
``schedule``, ``peek`` and ``step`` -- the only methods through which SimPy reaches its
queue -- with the same semantics, so SimPy's events, processes and ``run`` work on it
unchanged and nothing reads a private field of SimPy. The driver steps the same heap
itself (``DriverCore.run_until``, compiled) and puts its timers on it with one
``heappush`` of the ``(time, priority, id, event)`` tuple ``schedule`` would push
(``DriverCore.later``, the tool-call and wake-up timers in :mod:`.lifecycle`,
:mod:`.turns` and :mod:`.engine`, through ``DriverCore._queue``/``_eid``, which are this
heap and counter): same key, so ties still break in insertion order and runs stay
deterministic. Calling SimPy's own ``schedule`` and ``step`` per event instead costs about
0.3 us an event (sim/COST_MODEL.md, "SimPy's public API").

A timer needs no ``simpy.Timeout`` and no closure: :class:`Call` is the smallest object
with SimPy's event protocol (``callbacks``, and ``ok``: it never fails). Objects that are
themselves timer events while none of theirs is pending (trajectories, engines) follow
the same protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from itertools import count
from typing import Any

import simpy
from simpy.core import EmptySchedule, Infinity, StopSimulation
from simpy.events import NORMAL, URGENT

__all__ = ["NORMAL", "Call", "SimEnvironment"]


class SimEnvironment(simpy.Environment):
    """``simpy.Environment`` with its event queue in public fields (see the module doc)."""

    def __init__(self, initial_time: float = 0) -> None:
        super().__init__(initial_time)
        self.heap: list = []  # (time, priority, id, event), as SimPy's own queue
        self.ids = count()  # insertion ids: ties at one time and priority in schedule order
        self.clock: float = initial_time  # the time of the event being processed

    @property
    def now(self) -> float:
        """The current simulation time."""
        return self.clock

    def schedule(self, event: Any, priority: int = NORMAL, delay: float = 0) -> None:
        """Schedule an *event* with a given *priority* and a *delay*."""
        heappush(self.heap, (self.clock + delay, priority, next(self.ids), event))

    def peek(self) -> float:
        """The time of the next scheduled event (``Infinity`` if there is none)."""
        return self.heap[0][0] if self.heap else Infinity

    def step(self) -> None:
        """Process the next event, as ``simpy.Environment.step`` does (raises
        ``EmptySchedule`` when there is none, and a failed, undefused event's exception)."""
        try:
            self.clock, _, _, event = heappop(self.heap)
        except IndexError:
            raise EmptySchedule from None
        callbacks, event.callbacks = event.callbacks, None
        try:
            for callback in callbacks:
                callback(event)
        except StopSimulation:
            event.callbacks = callbacks[callbacks.index(callback) + 1:]
            self.schedule(event, URGENT - 1)
            raise
        if not event.ok and not event.defused:
            failure = event.value
            exc = type(failure)(*failure.args)
            exc.__cause__ = failure
            raise exc


class Call:
    """A scheduled call ``fn(a, b)`` (or data for a dedicated callback)."""

    __slots__ = ("a", "b", "callbacks", "fn")
    ok = True  # (SimPy's event protocol: it never fails)

    def __init__(self, callbacks: tuple, fn: Callable[[Any, Any], None] | None, a: Any, b: Any) -> None:
        self.callbacks = callbacks
        self.fn = fn
        self.a = a
        self.b = b
