"""The model that fills environment time an agent log did not record.

Older SWE-agent ``.traj`` files (before 0.7) and most published chat-transcript datasets
carry no timing, yet the simulator needs seconds of tool time after every turn. Rather than
guess silently, importers fill each missing value from this model and mark the row
``env_estimated=True``; ``rlsched trace import`` says how many rows were estimated.

The model: the turn's action (the command or tool call the model issued) is put in one of a
few classes by its leading command, and its time is a lognormal draw around the class median
(log-sigma ``SIGMA``, capped at ``CAP_SECONDS``):

======== ============ ==================================================================
class    median (s)   matched commands (first match wins; see ``_RULES``)
======== ============ ==================================================================
none     0            no action (a format error, a final answer with no tool call)
submit   1            submit / finish / exit commands
test     15           pytest, tox, unittest, go/cargo/npm/yarn/mvn/gradle test, make test
build    30           pip/npm/apt install, make, cargo/go build, mvn, gradle, cmake
run      2            python/node/ruby/java/bash running a script or snippet
edit     0.3          editor tools (edit, create, str_replace, insert), sed -i, patches
search   0.5          grep, rg, find, find_file, search_dir, search_file
view     0.3          open, goto, scroll, cat, head, tail, ls, cd, git status/diff/log
other    1            anything else
======== ============ ==================================================================

Where the numbers come from: the one published per-call statistic we know for SWE agents is
nilenso's analysis of 2,920 SWE-agent 1.1.0 runs on SWE-Bench Pro (GitHub
``nilenso/swe-bench-pro-cost-token-time-analysis``, ``docs/report.txt``; also cited in
``traces/SOURCES.md``): per task, tool time has a median of 76-131 s over ~65-78 calls, i.e.
about one second for a typical call, and 1.5-2.8 calls per task take over 10 s (~3% of
calls). ``other`` and ``submit`` take that one-second median. The split into classes is an
**assumption** shaped to match it: reading and editing files is a sub-second shell builtin,
so most calls land below a second; test runs and builds are the rare calls over 10 s (their
medians, 15 s and 30 s, sit between SWE-agent's default 30 s per-command timeout and the
~2 minutes the same analysis reports for the longest call per task). ``SIGMA = 1.0`` gives
each class a spread of about e (x2.7) either way, like the per-call spread in the
generator's presets. Draws are capped at ``CAP_SECONDS`` (the generator's command-timeout
cap, ``GenParams.env_seconds_cap``).

Draws are deterministic: the normal deviate of a row comes from a hash of its key
(``trajectory_id:turn``), so importing the same logs twice gives the same trace, and a
trajectory's estimate does not depend on which other files were imported with it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

SIGMA = 1.0
CAP_SECONDS = 1800.0
#: Name of the model, for reports.
MODEL_NAME = "envtime v1: action class x lognormal(sigma=1.0), see rlsched.traces.envtime"


@dataclass(frozen=True)
class ActionClass:
    name: str
    median_seconds: float
    sigma: float


CLASSES: dict[str, ActionClass] = {c.name: c for c in (
    ActionClass("none", 0.0, 0.0),
    ActionClass("submit", 1.0, SIGMA),
    ActionClass("test", 15.0, SIGMA),
    ActionClass("build", 30.0, SIGMA),
    ActionClass("run", 2.0, SIGMA),
    ActionClass("edit", 0.3, SIGMA),
    ActionClass("search", 0.5, SIGMA),
    ActionClass("view", 0.3, SIGMA),
    ActionClass("other", 1.0, SIGMA),
)}

_W = r"(?:^|[\s;&|(`])"  # a command starts the action or follows a shell separator
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple((name, re.compile(rx, re.I)) for name, rx in (
    ("submit", r"^\s*(?:submit|finish|exit|exit_\w+|task_complete|attempt_completion)\b"),
    ("test", _W + r"(?:pytest|py\.test|tox|nosetests|unittest|(?:go|cargo|npm|yarn|pnpm|mvn|"
             r"gradle|dotnet|mix|rake)\s+test|make\s+(?:test|check)|ctest|jest|phpunit|"
             r"runtests\.py|tests?/runtests)\b"),
    ("build", _W + r"(?:pip3?\s+install|python\d?(?:\.\d+)?\s+-m\s+pip\s+install|(?:npm|yarn|"
              r"pnpm)\s+(?:install|ci|build)|apt(?:-get)?\s+install|make|cmake|(?:cargo|go)\s+"
              r"build|mvn|gradle|python\d?(?:\.\d+)?\s+setup\.py|conda\s+install)\b"),
    ("edit", _W + r"(?:edit|create|str_replace|insert|append|apply_patch|patch|sed\s+-i|"
             r"str_replace_editor\s+(?:create|str_replace|insert|undo_edit)|"
             r"(?:file_)?editor\s+(?:create|str_replace|insert))\b"),
    ("run", _W + r"(?:python\d?(?:\.\d+)?|node|ruby|java|perl|php|bash|sh|go\s+run|cargo\s+run|"
            r"ipython)\b"),
    ("search", _W + r"(?:grep|rg|ag|find|find_file|search_dir|search_file|git\s+grep)\b"),
    ("view", _W + r"(?:open|goto|scroll_up|scroll_down|cat|head|tail|less|ls|cd|pwd|tree|wc|"
             r"str_replace_editor\s+view|(?:file_)?editor\s+view|view|git\s+(?:status|diff|log|"
             r"show))\b"),
))


def classify_action(action: str | None) -> str:
    """The class (a key of ``CLASSES``) of one action string; see the module table."""
    if action is None or not action.strip():
        return "none"
    text = action.strip()
    for name, rx in _RULES:
        if rx.search(text):
            return name
    return "other"


def _deviates(keys: Sequence[str]) -> np.ndarray:
    """A standard normal deviate per key, from a hash of the key (reproducible)."""
    u = np.empty(len(keys), dtype=np.float64)
    for i, key in enumerate(keys):
        h = int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")
        u[i] = (h + 0.5) / 2.0**64
    return ndtri(u)


def estimate_env_seconds(actions: Sequence[str | None], keys: Sequence[str]) -> np.ndarray:
    """Estimated environment seconds for each action; ``keys`` seed the draws row by row."""
    if len(actions) != len(keys):
        raise ValueError("actions and keys must have the same length")
    classes = [CLASSES[classify_action(a)] for a in actions]
    median = np.array([c.median_seconds for c in classes], dtype=np.float64)
    sigma = np.array([c.sigma for c in classes], dtype=np.float64)
    z = _deviates(keys) if len(keys) else np.zeros(0)
    seconds = median * np.exp(sigma * z)
    return np.round(np.minimum(seconds, CAP_SECONDS), 3)
