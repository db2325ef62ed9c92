"""Third-party policies: a plugin's defect is one line naming the plugin, never a traceback.

A shipped policy is rlsched's own code, tested here; a plugin (an entry point of the
``rlsched.policies`` group) is code the user installed, so its mistakes are the user's to
fix, like a bad config: ``params`` that are not :class:`~rlsched.cluster.policy.Param`
records, a constructor that rejects the parameters it declares, an ``on_event`` (or
``reset``) that raises or answers something other than a list of commands. Each ends as
one :class:`PluginError` line naming the plugin, the defect and (for ``on_event``) the
event; ``rlsched policy check`` reports it as a FAIL.

The registry hands out a plugin class wrapped by :func:`guarded`: a subclass of the
plugin's own class (so ``isinstance``, ``name`` and ``params`` are unchanged) whose
constructor, ``reset`` and ``on_event`` turn any exception into that line. An error the
plugin raises on purpose as an :class:`~rlsched.cluster.errors.RlschedError` (its own
one-line refusal of a parameter) passes through unchanged.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any

from rlsched.cluster.commands import Command
from rlsched.cluster.errors import InvariantViolation, PolicyError, RlschedError, shown
from rlsched.cluster.events import Event
from rlsched.cluster.policy import Param
from rlsched.cluster.view import ClusterView


class PluginError(PolicyError):
    """A defect in a policy's own code (a plugin's, usually). ``policy`` is the registry
    name it was asked for under, so ``policy check NAME`` can tell its own plugin's defect
    from another plugin's that broke the lookup."""

    def __init__(self, policy: str, message: str) -> None:
        super().__init__(message)
        self.policy = policy


def params_defect(params: Any) -> str | None:
    """What is wrong with a class's ``params`` declaration, or None when it is a tuple of
    :class:`Param` (any other entry broke ``policy list`` and spec parsing on ``.name``)."""
    if not isinstance(params, tuple):
        return f"`params` is {shown(params)}: expected a tuple of Param"
    for i, p in enumerate(params):
        if not isinstance(p, Param):
            return (f"params[{i}] is {shown(p)}, not a Param record (declare each parameter with "
                    "rlsched.cluster.policy.param(...) or Param(...))")
    return None


def exception_line(exc: BaseException) -> str:
    """``Type: first line of the message``, cut to 200 characters (an error is one line)."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def event_label(event: Event, view: ClusterView) -> str:
    """``TrajectoryFinished at t=12.5s``: which event a policy was answering."""
    try:
        return f"{type(event).__name__} at t={float(view.now):g}s"
    except Exception:  # (a view without a clock: the event's name is enough)
        return type(event).__name__


def answer(on_event: Callable[[Event, ClusterView], Any], who: str, policy: str,
           event: Event, view: ClusterView) -> list[Command]:
    """Call ``on_event`` and return its commands as a list, or raise one
    :class:`PluginError` line (``who``: how the line names the policy) when it raises,
    returns something that is not a list of commands (None: a forgotten ``return []``), or
    a command that is not a :class:`~rlsched.cluster.commands.Command` (which the driver
    would silently skip)."""
    try:
        out = on_event(event, view)
        if not isinstance(out, list | tuple):
            if out is None or isinstance(out, str | bytes | Command) or not isinstance(out, Iterable):
                raise PluginError(policy, f"{who}: on_event({event_label(event, view)}) returned "
                                          f"{shown(out)}: expected a list of commands ([] for none)")
            out = list(out)  # (a generator: its errors are the policy's too)
    except (RlschedError, InvariantViolation):  # (said on purpose, or a driver's own check)
        raise
    except Exception as exc:
        raise PluginError(policy, f"{who}: on_event({event_label(event, view)}) raised "
                                  f"{exception_line(exc)}") from None
    for i, cmd in enumerate(out):
        if not isinstance(cmd, Command):
            raise PluginError(policy, f"{who}: on_event({event_label(event, view)}) returned "
                                      f"{shown(cmd)} as command {i}: expected a Command "
                                      "(rlsched.cluster.commands)")
    return list(out)


def guarded(cls: type, who: str) -> type:
    """A subclass of the plugin class ``cls`` whose constructor, ``reset`` and ``on_event``
    end in one :class:`PluginError` line (``who``, e.g. ``policy plugin 'x' (mod:Cls)``)
    instead of a traceback from deep inside a driver."""
    name = str(getattr(cls, "name", cls.__qualname__))

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            cls.__init__(self, *args, **kwargs)
        except RlschedError:
            raise
        except Exception as exc:
            given = ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "no parameters"
            raise PluginError(name, f"{who}: its constructor rejected its parameters ({given}): "
                                    f"{exception_line(exc)}") from None

    def reset(self: Any, view: ClusterView, rng: random.Random) -> None:
        try:
            cls.reset(self, view, rng)
        except RlschedError:
            raise
        except Exception as exc:
            raise PluginError(name, f"{who}: reset raised {exception_line(exc)}") from None

    def on_event(self: Any, event: Event, view: ClusterView) -> list[Command]:
        return answer(lambda e, v: cls.on_event(self, e, v), who, name, event, view)

    body: dict[str, Any] = {"__init__": __init__, "__doc__": cls.__doc__, "__module__": cls.__module__,
                            "__qualname__": cls.__qualname__}
    # (a method the class lacks stays missing: the conformance kit names it)
    body.update({k: f for k, f in (("reset", reset), ("on_event", on_event)) if hasattr(cls, k)})
    return type(cls.__name__, (cls,), body)
