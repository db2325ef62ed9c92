"""What every importer produces, and how those records become one canonical trace.

Format readers (``import_swe_agent``, ``import_messages``, ``import_openhands``,
``import_mini_swe_agent``, ``import_verl``) turn one log into :class:`ImportedTrajectory`
records: per-turn token counts, the recorded environment seconds (NaN where the log has
none) and the action text of each turn. :func:`to_frame` then fills the missing seconds from
:mod:`~rlsched.traces.envtime` (marking those rows ``env_estimated``), makes trajectory ids
unique, and validates the result with the schema, so every importer gets the same columns
and the same guarantees.

Extra columns of an imported trace (kept and ignored by loaders, read by reports):
``token_source`` (``estimate:chars/4``, ``tokenizer:<dir>``, or ``recorded:usage`` on rows
whose prompt and output counts both come from the token usage the model API reported),
``env_estimated`` (bool), ``exit_status`` (the scaffold's exit status, or None). A format
that records the RL step (verl's dumps) also fills the schema's ``step`` column.

Also here: the pieces several readers share -- reading JSON / JSON-lines files into records
with one-line errors, timestamps in the shapes logs use, the new-prompt-token arithmetic on
recorded API usage, and a short description of an unknown record's shape (with a hint when
it looks like another importer's format).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rlsched.cluster.errors import TraceError
from rlsched.traces.envtime import estimate_env_seconds
from rlsched.traces.schema import MAX_ENV_SECONDS, json_name, json_problem, validate_trace


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
    #: Per turn, where its token counts come from (``RECORDED_SOURCE`` or a counter's
    #: source); empty: every turn was counted with the import's counter.
    token_sources: tuple[str, ...] = ()
    #: The RL step the log says this trajectory was generated in, when it says.
    step: int | None = None

    def __post_init__(self) -> None:
        n = len(self.prompt_tokens)
        if not (len(self.output_tokens) == len(self.env_seconds) == len(self.actions) == n):
            raise ValueError("per-turn fields of an ImportedTrajectory differ in length")
        if self.token_sources and len(self.token_sources) != n:
            raise ValueError("token_sources of an ImportedTrajectory differs in length")


#: ``token_source`` of a row whose counts are the model API's reported usage.
RECORDED_SOURCE = "recorded:usage"


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
    # (a duration past the schema's bound is damage, like one that summed to inf: estimated,
    # not a failure of the whole import)
    missing = np.isnan(env) | (env > MAX_ENV_SECONDS)
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
    steps = [t.step for t in trajs]
    if trajs and all(st is not None for st in steps):
        data["step"] = np.array(steps, dtype=np.int64)[traj_of_row]
    data["exit_status"] = pd.Series([trajs[i].exit_status for i in traj_of_row], dtype=object)
    data["token_source"] = pd.Series(
        [src for t in trajs for src in (t.token_sources or (token_source,) * len(t.prompt_tokens))],
        dtype=object)
    data["env_estimated"] = missing
    return validate_trace(pd.DataFrame(data), source)


# ------------------------------------------------------------------ shared reader pieces

def timestamp_seconds(value: Any) -> float | None:
    """Seconds since the epoch from a log's timestamp, or None when it is not one.

    Numbers are epoch seconds (milliseconds when above 1e11: 1e11 s is the year 5138);
    strings are ISO 8601. An ISO time without a zone is read as UTC: logs that write local
    naive times (``datetime.now().isoformat()``) are only ever subtracted from each other.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        if not math.isfinite(value):
            return None
        return float(value) / 1000.0 if abs(value) > 1e11 else float(value)
    if isinstance(value, str) and value.strip():
        try:
            when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return when.timestamp()
    return None


def elapsed(start: float | None, end: float | None) -> float:
    """``end - start`` in seconds, NaN when either is missing or time ran backwards."""
    if start is None or end is None or end < start:
        return math.nan
    return round(end - start, 6)


def usage_prompt_deltas(totals: Sequence[int | None], outputs: Sequence[int | None],
                        kept: Sequence[bool]) -> list[int | None]:
    """New prompt tokens per model call from the API's reported usage.

    An API reports the whole context it read (``prompt_tokens``) on every call; the trace
    wants what was appended since the previous call: ``total[k] - total[k-1] - output[k-1]``
    (the previous output stays in the context when ``kept[k-1]``; a scaffold that drops an
    unparsable reply does not keep it). Turn 0 is its whole prompt. None where a number is
    missing or the difference is negative (the scaffold condensed or cut the context, so the
    arithmetic says nothing about what was appended): the caller counts the text instead.
    """
    out: list[int | None] = []
    for k, total in enumerate(totals):
        if total is None:
            out.append(None)
            continue
        if k == 0:
            out.append(int(total))
            continue
        prev, prev_out = totals[k - 1], outputs[k - 1]
        if prev is None or (kept[k - 1] and prev_out is None):
            out.append(None)
            continue
        delta = int(total) - int(prev) - (int(prev_out) if kept[k - 1] else 0)
        out.append(delta if delta >= 0 else None)
    return out


#: Above this a "token count" is damage, not a count (a trillion tokens in one call).
MAX_TOKEN_COUNT = 10**12


def whole_number(value: Any) -> int | None:
    """A token count from a usage field: a whole number in ``0..MAX_TOKEN_COUNT``, else None
    (the row is then counted from its text and says so in ``token_source``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or not 0 <= value <= MAX_TOKEN_COUNT or value != int(value):
        return None
    return int(value)


def as_list(value: Any) -> list:
    """``value`` when it is a list, else empty: a log's optional list fields may be null or
    damaged, and a reader iterating them must not crash."""
    return value if isinstance(value, list) else []


#: Keys that mark each importer's records, for hints on a record of the wrong format.
_FORMAT_MARKS: tuple[tuple[str, frozenset[str]], ...] = (
    ("swe-agent", frozenset({"trajectory", "history", "info"})),
    ("mini-swe-agent", frozenset({"messages", "trajectory_format"})),
    ("mini-swe-agent", frozenset({"messages", "info"})),
    ("openhands", frozenset({"instance_id", "history", "test_result"})),
    ("openhands", frozenset({"instance_id", "history", "metadata"})),
    ("verl", frozenset({"input", "output", "score"})),
    ("messages", frozenset({"messages"})),
    ("messages", frozenset({"conversations"})),
)


def shape_of(value: Any, *, expected_format: str) -> str:
    """A short description of a record of an unknown shape, for a one-line skip reason:
    its type or first keys, and the ``--format`` it looks like when that is another one."""
    if value is None:
        return "null"
    if not isinstance(value, dict):
        return f"a JSON {json_name(value)}"
    keys = sorted(json.dumps(str(k), ensure_ascii=False)[1:-1][:40] for k in value)
    shown = ", ".join(keys[:6]) + (", ..." if len(keys) > 6 else "")
    guess = next((name for name, marks in _FORMAT_MARKS if marks <= value.keys()), None)
    hint = f"; looks like --format {guess}" if guess and guess != expected_format else ""
    return f"an object with keys {shown or 'none'}{hint}"


def read_bytes_text(path: Path, what: str) -> str:
    """The file's text (UTF-8, BOM allowed), or a one-line :class:`TraceError`."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise TraceError(f"{path}: cannot be read ({err.strerror}) — expected {what}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise TraceError(f"{path}: line {line}: not UTF-8 — expected {what}") from None
    if not text.strip():
        raise TraceError(f"{path}: empty file — expected {what}")
    return text


def json_records(path: Path, what: str) -> list[tuple[int, Any, str | None]]:
    """``(line, record or None, error)`` for a JSON-lines file, a JSON array, or one JSON
    object (pretty-printed or not), so a reader takes whichever its users write."""
    text = read_bytes_text(path, what)
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as err:
            raise TraceError(f"{path}: invalid JSON array: {json_problem(err)} at line {err.lineno} "
                             f"column {err.colno} — expected {what}") from None
        return [(n, rec, None) for n, rec in enumerate(doc, start=1)]
    out: list[tuple[int, Any, str | None]] = []
    decoder = json.JSONDecoder()
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            out.append((number, decoder.decode(raw), None))
        except json.JSONDecodeError as err:
            out.append((number, None, f"invalid JSON: {json_problem(err)} at column {err.colno}"))
    if out and all(err for _, _, err in out) and stripped.startswith("{"):
        try:  # one pretty-printed object is one record
            return [(1, json.loads(text), None)]
        except json.JSONDecodeError as err:
            cut = " (truncated file?)" if err.pos >= len(text.rstrip()) else ""
            raise TraceError(f"{path}: invalid JSON{cut}: {json_problem(err)} at line {err.lineno} "
                             f"column {err.colno} — expected {what}") from None
    return out


def read_records(path: Path, what: str, read_one: Any
                 ) -> tuple[list[ImportedTrajectory], list[tuple[str, str]]]:
    """Run ``read_one(record, where, line)`` on every record of ``path`` (see
    :func:`json_records`): a bad record is skipped with ``file:line`` and its reason, the
    rest go through; a file with no usable record raises one :class:`TraceError`."""
    trajs: list[ImportedTrajectory] = []
    skipped: list[tuple[str, str]] = []
    for line, rec, err in json_records(path, what):
        where = f"{path}:{line}"
        if err is not None:
            skipped.append((where, f"{err} — expected {what}"))
            continue
        try:
            trajs.append(read_one(rec, where, line))
        except TraceError as exc:
            skipped.append((where, str(exc).removeprefix(f"{where}: ")))
    if not trajs and not skipped:
        raise TraceError(f"{path}: no records in it — expected {what}")
    if not trajs:
        first_where, first_reason = skipped[0]
        if len(skipped) == 1 and first_where == f"{path}:1":
            raise TraceError(f"{path}: {first_reason}")
        more = f" (and {len(skipped) - 1} more bad lines)" if len(skipped) > 1 else ""
        line = first_where.removeprefix(f"{path}:")
        raise TraceError(f"{path}: nothing usable (line {line}: {first_reason}){more}")
    return trajs, skipped
