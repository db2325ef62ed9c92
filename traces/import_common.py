"""What every importer produces, and how those records become one canonical trace.

Format readers (``import_swe_agent``, ``import_messages``) turn one log into
:class:`ImportedTrajectory` records: per-turn token counts, the recorded environment seconds
(NaN where the log has none) and the action text of each turn. :func:`to_frame` then fills
the missing seconds from :mod:`~rlsched.traces.envtime` (marking those rows
``env_estimated``), makes trajectory ids unique, and validates the result with the schema,
so every importer gets the same columns and the same guarantees.

Extra columns of an imported trace (kept and ignored by loaders, read by reports):
``token_source`` (``estimate:chars/4`` or ``tokenizer:<dir>``), ``env_estimated`` (bool),
``exit_status`` (the scaffold's exit status, or None).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rlsched.traces.envtime import estimate_env_seconds
from rlsched.traces.schema import validate_trace


@dataclass(frozen=True)
class ImportedTrajectory:
    """One trajectory read from a log; lists hold one entry per turn."""

    task_id: str
    trajectory_id: str
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    env_seconds: tuple[float, ...]  # NaN: not recorded, to be estimated
    actions: tuple[str, ...]  # what the turn asked the environment to do (for estimates)
    truncated: bool
    reward: float = math.nan
    exit_status: str | None = None

    def __post_init__(self) -> None:
        n = len(self.prompt_tokens)
        if not (len(self.output_tokens) == len(self.env_seconds) == len(self.actions) == n):
            raise ValueError("per-turn fields of an ImportedTrajectory differ in length")


# SWE-agent exit statuses (sweagent/agent/agents.py, 1.x; sweagent/environment/swe_env.py,
# 0.x) that mean the scaffold, not the agent, ended the run: a cost, context, time or step
# budget ran out, or the model/environment kept failing. Autosubmitted runs keep the reason
# in parentheses ("submitted (exit_cost)") and are truncated too: the agent did not finish.
LIMIT_EXITS = frozenset({
    "exit_cost", "exit_context", "exit_total_execution_time", "exit_command_timeout",
    "exit_format", "exit_error", "exit_api", "exit_environment_error", "early_exit",
    "exit_step_limit", "exit_max_steps", "exit_time", "exit_timeout",
})
# Statuses where the agent itself ended the run.
AGENT_EXITS = frozenset({"submitted", "exit_command", "exit_forfeit", "skipped"})
_WRAPPED = re.compile(r"^\s*submitted\s*\((?P<inner>[^)]*)\)\s*$", re.I)


def exit_truncates(status: str | None, *, missing: bool) -> bool:
    """Whether an exit status means the recording stopped the trajectory.

    ``submitted (X)`` is judged by ``X``. A status in ``LIMIT_EXITS`` or any other
    ``exit_*`` the agent cannot choose is a truncation; ``AGENT_EXITS`` are not. ``missing``
    is the answer when there is no status at all (a ``.traj`` without one was cut off
    mid-run; a transcript dataset without the field says nothing).
    """
    if status is None or not str(status).strip():
        return missing
    text = str(status).strip().lower()
    wrapped = _WRAPPED.match(text)
    if wrapped:
        text = wrapped.group("inner").strip()
        if not text:
            return False
    if text in LIMIT_EXITS:
        return True
    if text in AGENT_EXITS:
        return False
    return text.startswith("exit_") or "limit" in text or "timeout" in text


def _unique_ids(ids: Sequence[str]) -> list[str]:
    """Trajectory ids made unique in file order: a repeat of ``x`` becomes ``x#2``, ..."""
    seen: dict[str, int] = {}
    taken = set(ids)
    out = []
    for tid in ids:
        n = seen.get(tid, 0) + 1
        seen[tid] = n
        if n == 1:
            out.append(tid)
            continue
        candidate = f"{tid}#{n}"
        while candidate in taken:
            n += 1
            candidate = f"{tid}#{n}"
        seen[tid] = n
        taken.add(candidate)
        out.append(candidate)
    return out


def to_frame(trajs: Sequence[ImportedTrajectory], token_source: str,
             source: str = "import") -> pd.DataFrame:
    """Concatenate imported trajectories into a validated, canonical trace.

    Missing env seconds are estimated (see :mod:`~rlsched.traces.envtime`) with the keys
    ``<trajectory_id>:<turn>`` and flagged in ``env_estimated``. ``reward`` is written only
    when some trajectory has one.
    """
    ids = _unique_ids([t.trajectory_id for t in trajs])
    lengths = np.array([len(t.prompt_tokens) for t in trajs], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    traj_of_row = np.repeat(np.arange(len(trajs)), lengths)
    turn = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(starts, lengths)
    env = np.array([s for t in trajs for s in t.env_seconds], dtype=np.float64)
    missing = np.isnan(env)
    if missing.any():
        rows = np.flatnonzero(missing)
        actions = [a for t in trajs for a in t.actions]
        keys = [f"{ids[traj_of_row[r]]}:{turn[r]}" for r in rows]
        env[rows] = estimate_env_seconds([actions[r] for r in rows], keys)
    data: dict[str, object] = {
        "task_id": pd.Series([trajs[i].task_id for i in traj_of_row], dtype=object),
        "trajectory_id": pd.Series([ids[i] for i in traj_of_row], dtype=object),
        "turn": turn,
        "prompt_tokens": np.array([x for t in trajs for x in t.prompt_tokens], dtype=np.int64),
        "output_tokens": np.array([x for t in trajs for x in t.output_tokens], dtype=np.int64),
        "env_seconds": env,
        "truncated": np.array([trajs[i].truncated for i in traj_of_row], dtype=bool),
    }
    rewards = np.array([t.reward for t in trajs], dtype=np.float64)
    if (~np.isnan(rewards)).any():
        data["reward"] = rewards[traj_of_row]
    data["exit_status"] = pd.Series([trajs[i].exit_status for i in traj_of_row], dtype=object)
    data["token_source"] = pd.Series([token_source] * len(turn), dtype=object)
    data["env_estimated"] = missing
    return validate_trace(pd.DataFrame(data), source)
