"""Import chat transcripts (JSON lines, one trajectory per line) as trace rows.

Public agent-trajectory datasets publish each run as one record holding a list of chat
messages. The shapes accepted here were checked against dataset cards on Hugging Face:

- OpenAI style, ``messages`` with ``role`` (system/user/assistant/tool) and ``content`` (a
  string or a list of content parts), assistant ``tool_calls`` (``function.name``,
  ``function.arguments``) and ``role: tool`` results: e.g. ``nvidia/open-swe-traces``
  (fields ``instance_id``, ``trajectory_id``, ``messages``, ``tools``, ``resolved``) and
  the SWE-Gym OpenHands trajectory sets (``messages``, ``instance_id``, ``resolved``).
- ``trajectory`` with ``role`` and ``text`` (roles ``system``/``user``/``ai``), e.g.
  ``nebius/SWE-agent-trajectories`` (fields ``instance_id``, ``model_name``, ``target`` --
  the patch passed the tests --, ``trajectory``, ``exit_status``).
- ShareGPT style, ``conversations`` with ``from`` (system/human/gpt/function_call/
  observation) and ``value``.

A file may also be one JSON array of such records. Role aliases: assistant = ``assistant``,
``gpt``, ``ai``, ``model``, ``bot``, ``agent``, ``function_call``; everything else (user,
human, tool, function, observation, ipython, environment...) is input the model reads.

Mapping (one row per assistant message):

- ``prompt_tokens``: everything since the previous assistant message (turn 0: the system and
  user messages, plus the record's ``tools`` schemas, which a chat template renders into the
  prompt); ``output_tokens``: the assistant message's text, its ``reasoning_content`` /
  ``reasoning`` / ``thinking`` when present, and its tool calls (name and arguments).
  Messages after the last assistant message feed no turn and are not counted.
- ``env_seconds``: from per-message timing when present -- a numeric ``execution_time``,
  ``env_seconds``, ``duration`` or ``elapsed`` (>= 0) on the messages after the turn (summed), or
  else ``timestamp`` (epoch seconds -- milliseconds when above 1e11 -- or ISO 8601) on the
  assistant message and on the last message before the next assistant message (their
  difference). Without timing the value is estimated from the turn's action
  (``env_estimated``; see :mod:`~rlsched.traces.envtime`): the tool call's command
  (ShareGPT ``function_call`` values are parsed as calls), or for text-only agents the last
  fenced code block of the message. A final assistant message that nothing follows ran no
  tool: 0 seconds, recorded, not estimated.
- ids: ``task_id`` from ``instance_id``, ``task_id`` or ``problem_id``, else the trajectory
  id; ``trajectory_id`` from ``trajectory_id``, ``id`` or ``run_id``, else
  ``<file stem>:<line>`` (made unique across an import).
- ``reward``: ``reward`` or ``score`` (a number), else ``resolved`` / ``target`` /
  ``success`` (true/1 -> 1.0, false/0 -> 0.0, anything else unknown), on every row.
- ``truncated``: a boolean ``truncated`` field, else ``exit_status`` judged as for SWE-agent
  (limit exits truncate); a record without either is not truncated.

A bad line (not JSON, no messages, no assistant turn) is skipped with its file and line
number; the other lines of the file still go through.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from rlsched.cluster.errors import TraceError
from rlsched.traces.import_common import (
    ImportedTrajectory,
    exit_truncates,
    read_bytes_text,
    timestamp_seconds,
)
from rlsched.traces.schema import json_name, json_problem
from rlsched.traces.tokens import TokenCounter, count_all, text_of

SUFFIXES = (".jsonl", ".json", ".ndjson")
MESSAGE_KEYS = ("messages", "conversations", "conversation", "trajectory", "history")
ASSISTANT_ROLES = frozenset({"assistant", "gpt", "ai", "model", "bot", "agent",
                             "function_call", "chatbot"})
TASK_KEYS = ("instance_id", "task_id", "problem_id")
TRAJ_KEYS = ("trajectory_id", "id", "run_id")
DURATION_KEYS = ("execution_time", "env_seconds", "duration", "elapsed")
_CODE_BLOCK = re.compile(r"```[^\n]*\n(.*?)```", re.S)
_SHELL_TOOL = re.compile(r"bash|shell|terminal|execute|run|cmd|command|exec", re.I)


def _role(msg: dict) -> str:
    role = msg.get("role", msg.get("from"))
    return str(role).strip().lower() if role is not None else ""


def _content(msg: dict) -> str:
    for key in ("content", "value", "text"):
        if key in msg and msg[key] is not None:
            text = text_of(msg[key])
            if text:
                return text
    return text_of(msg.get("system_prompt"))


def _tool_call_texts(msg: dict) -> list[str]:
    texts = []
    for call in msg.get("tool_calls") or []:
        if not isinstance(call, dict):
            texts.append(text_of(call))
            continue
        fn = call.get("function") if isinstance(call.get("function"), dict) else call
        texts.append(text_of(fn.get("name")))
        args = fn.get("arguments", fn.get("input"))
        texts.append(args if isinstance(args, str) else text_of(args) if args else "")
    fc = msg.get("function_call")
    if isinstance(fc, dict):
        texts += [text_of(fc.get("name")), text_of(fc.get("arguments"))]
    return texts


def _action(msg: dict) -> str:
    """What the turn asked the environment to do, for the env-time estimate."""
    calls = list(msg.get("tool_calls") or [])
    if isinstance(msg.get("function_call"), dict):
        calls.append({"function": msg["function_call"]})
    if _role(msg) == "function_call":  # ShareGPT: the value is the call as JSON
        try:
            call = json.loads(_content(msg))
        except json.JSONDecodeError:
            call = None
        if isinstance(call, dict) and "name" in call:
            calls.append({"function": call})
    for call in calls:
        if not isinstance(call, dict):
            continue
        fn = call.get("function") if isinstance(call.get("function"), dict) else call
        name = str(fn.get("name") or "")
        args = fn.get("arguments", fn.get("input"))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return f"{name} {args}"
        command = ""
        if isinstance(args, dict):
            for key in ("command", "cmd", "code", "script", "input"):
                if isinstance(args.get(key), str):
                    command = args[key]
                    break
        if command and _SHELL_TOOL.search(name) and "edit" not in name.lower():
            return command
        return f"{name} {command}".strip()
    text = _content(msg)
    blocks = _CODE_BLOCK.findall(text)
    if blocks:
        return blocks[-1].strip()
    return ""


def _env_seconds(turn_msg: dict, after: list[dict]) -> float:
    """Recorded env time of one turn, or NaN when the transcript has no timing for it.

    A negative duration is damage, like a string or an infinity: the turn falls back to
    its timestamps, else to the estimate (``env_estimated``). It used to be clamped to a
    recorded 0 s -- a tool call that took no time, which no other importer writes."""
    durations = [m.get(k) for m in after for k in DURATION_KEYS if k in m]
    numbers = [float(d) for d in durations
               if isinstance(d, int | float) and not isinstance(d, bool) and math.isfinite(d) and d >= 0]
    total = sum(numbers)
    if numbers and len(numbers) == len(durations) and math.isfinite(total):  # (1e308 twice: inf)
        return total
    start = timestamp_seconds(turn_msg.get("timestamp"))
    end = timestamp_seconds(after[-1].get("timestamp")) if after else None
    if start is not None and end is not None and end >= start:
        return end - start
    return math.nan


def _reward(rec: dict) -> float:
    for key in ("reward", "score"):
        value = rec.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    for key in ("resolved", "target", "success"):
        if key in rec:
            value = rec[key]
            if value is True or value == 1:
                return 1.0
            if value is False or (value == 0 and not isinstance(value, str)):
                return 0.0
            return math.nan
    return math.nan


def _first_str(rec: dict, keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = rec.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
    return None


def read_record(rec: Any, where: str, default_id: str,
                counter: TokenCounter) -> ImportedTrajectory:
    """One transcript record -> one trajectory; ``where`` names it in errors (file:line)."""
    if not isinstance(rec, dict):
        raise TraceError(f"{where}: a JSON {json_name(rec)} — expected one transcript "
                         f"object per line")
    key = next((k for k in MESSAGE_KEYS if isinstance(rec.get(k), list)), None)
    if key is None:
        keys = ", ".join(sorted(map(str, rec))[:6]) or "none"
        hint = " (a SWE-agent .traj? use --format swe-agent)" if "info" in rec else ""
        raise TraceError(f"{where}: no message list (keys: {keys}){hint} — expected "
                         f"'messages' (role/content), 'conversations' (from/value) or "
                         f"'trajectory'")
    msgs = rec[key]
    if not all(isinstance(m, dict) for m in msgs):
        raise TraceError(f"{where}: '{key}' holds non-objects — expected chat messages with "
                         f"role/content or from/value")
    turn_at = [i for i, m in enumerate(msgs) if _role(m) in ASSISTANT_ROLES]
    if not turn_at:
        roles = sorted({_role(m) or "?" for m in msgs})
        raise TraceError(f"{where}: no assistant turn ({len(msgs)} messages, roles "
                         f"{', '.join(roles) or 'none'}) — expected at least one message from "
                         f"the model (role assistant/gpt/ai)")
    tools = rec.get("tools")
    tool_texts = [text_of(t) if not isinstance(t, str) else t for t in tools] \
        if isinstance(tools, list) else []
    prompt, output, env, actions = [], [], [], []
    prev = -1
    for n, i in enumerate(turn_at):
        before = [_content(m) for m in msgs[prev + 1:i]]
        prompt.append(count_all(counter, (tool_texts if n == 0 else []) + before))
        msg = msgs[i]
        pieces = [_content(msg)] + [text_of(msg.get(k)) for k in
                                    ("reasoning_content", "reasoning", "thinking")]
        output.append(count_all(counter, pieces + _tool_call_texts(msg)))
        nxt = turn_at[n + 1] if n + 1 < len(turn_at) else len(msgs)
        after = msgs[i + 1:nxt]
        env.append(_env_seconds(msg, after) if after else 0.0)
        actions.append(_action(msg))
        prev = i
    traj_id = _first_str(rec, TRAJ_KEYS) or default_id
    status = rec.get("exit_status")
    status = str(status) if status is not None else None
    truncated = rec.get("truncated")
    if not isinstance(truncated, bool):
        truncated = exit_truncates(status, missing=False)
    return ImportedTrajectory(
        task_id=_first_str(rec, TASK_KEYS) or traj_id,
        trajectory_id=traj_id,
        prompt_tokens=tuple(prompt),
        output_tokens=tuple(output),
        env_seconds=tuple(env),
        actions=tuple(actions),
        truncated=truncated,
        reward=_reward(rec),
        exit_status=status,
    )


def _records(path: Path) -> list[tuple[int, Any, str | None]]:
    """(line, parsed record or None, error) per non-blank line; a JSON array is one file."""
    text = read_bytes_text(path, "JSON lines of chat transcripts")
    if text.lstrip().startswith("["):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as err:
            raise TraceError(f"{path}: invalid JSON array: {json_problem(err)} at line {err.lineno} "
                             f"column {err.colno} — expected a JSON array of transcripts or "
                             f"JSON lines") from None
        return [(n, rec, None) for n, rec in enumerate(doc, start=1)]
    out: list[tuple[int, Any, str | None]] = []
    decoder = json.JSONDecoder()
    lines = text.splitlines()
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            out.append((number, decoder.decode(raw), None))
        except json.JSONDecodeError as err:
            out.append((number, None, f"{json_problem(err)} at column {err.colno}"))
    if out and all(err for _, _, err in out):
        try:  # one pretty-printed JSON object: say so instead of N line errors
            doc = json.loads(text)
        except json.JSONDecodeError:
            doc = None
        if isinstance(doc, dict):
            what = ("a SWE-agent .traj (use --format swe-agent)" if "trajectory" in doc
                    and "info" in doc else "a single pretty-printed JSON object")
            raise TraceError(f"{path}: {what} — expected JSON lines, one transcript per line")
    return out


def read_file(path: Path, counter: TokenCounter
              ) -> tuple[list[ImportedTrajectory], list[tuple[str, str]]]:
    """Importer entry point: every good line is a trajectory, every bad line a skip.

    A file none of whose lines is usable raises :class:`TraceError` (skipped as a whole,
    with the first line's problem and how many lines had one).
    """
    trajs: list[ImportedTrajectory] = []
    skipped: list[tuple[str, str]] = []
    for line, rec, err in _records(path):
        where = f"{path}:{line}"
        if err is not None:
            skipped.append((where, f"invalid JSON: {err} — expected one transcript object "
                                   f"per line"))
            continue
        try:
            trajs.append(read_record(rec, where, f"{path.stem}:{line}", counter))
        except TraceError as exc:
            skipped.append((where, str(exc).removeprefix(f"{where}: ")))
    if not trajs and not skipped:
        raise TraceError(f"{path}: no transcripts in it — expected JSON lines, one transcript "
                         f"per line")
    if not trajs:
        first_where, first_reason = skipped[0]
        more = f" (and {len(skipped) - 1} more bad lines)" if len(skipped) > 1 else ""
        line = first_where.removeprefix(f"{path}:")
        raise TraceError(f"{path}: no usable transcript (line {line}: {first_reason}){more}")
    return trajs, skipped
