"""The project's own error types.

Every error a *user* can cause (a bad trace, config, policy spec, cost-model file, run
directory) is an :class:`RlschedError`. Its message is one line that names the file, row,
field or value and what was expected; the command line prints that line and exits with
code 2 -- no traceback. Anything else that escapes is a bug in rlsched.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class RlschedError(Exception):
    """A problem with the user's input. ``str(err)`` is the one line to show."""

    exit_code = 2


class TraceError(RlschedError):
    """A trace file is missing, unreadable or breaks the schema."""


class ConfigError(RlschedError):
    """A run configuration or cost-model file has an unknown key or a bad value."""


class PolicyError(RlschedError):
    """An unknown policy, a bad policy spec or parameter, or an illegal command."""


class RecordError(RlschedError):
    """A run directory is missing, corrupt or from an incompatible version."""


class LiveBackendError(RlschedError):
    """The live backend cannot start: missing extra, no free slots, bad checkpoint."""


class Interrupted(Exception):
    """The user stopped the work (Ctrl-C) after part of it was written. Not an
    :class:`RlschedError`: nothing was wrong with the input, and code that reports bad
    input must not swallow it. ``str(err)`` says what was kept and where; the command line
    prints it and exits with 130, the shell's code for SIGINT."""

    exit_code = 130


class InvariantViolation(RuntimeError):
    """A driver or policy broke an invariant (GPU in two roles, a lost trajectory, tokens
    not conserved, time going backwards, staleness over the bound). Always a bug, never
    the user's input: the message says which invariant and where."""


def shown(value: object) -> str:
    """A value as an error line shows it: its repr, cut to 40 characters (a fuzzed
    400-digit number or a huge list must not become a screenful). A numpy scalar (a cell
    of a table) shows as the Python value it holds, ``5`` rather than ``np.int64(5)``."""
    if getattr(value, "shape", None) == () and callable(getattr(value, "item", None)):
        value = value.item()  # (numpy scalars, without importing numpy here)
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest known name, or nothing."""
    near = difflib.get_close_matches(key, sorted(known), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""
