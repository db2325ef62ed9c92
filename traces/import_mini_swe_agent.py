"""Import mini-swe-agent trajectories (``<instance_id>.traj.json``, one trajectory per file).

What a file holds (read from mini-swe-agent's public source, repository
``SWE-agent/mini-swe-agent``: ``src/minisweagent/agents/default.py`` (``run``, ``query``,
``serialize``), ``src/minisweagent/models/litellm_model.py`` (``query``),
``src/minisweagent/models/utils/actions_toolcall.py`` and ``actions_text.py`` (actions,
format errors, observation messages), ``actions_toolcall_response.py`` (the Responses API
variant), ``src/minisweagent/run/benchmarks/swebench.py``, ``docs/usage/output_files.md``
and ``docs/advanced/v2_migration.md`` on main (2.x); ``agents/default.py``,
``models/litellm_model.py`` and ``run/utils/save.py`` at tags v1.5.0 and v1.17.5):

- ``info``: ``exit_status`` (``Submitted``, ``LimitsExceeded``, ``TimeExceeded``,
  ``RepeatedFormatError``, or an exception's class name), ``submission``, ``model_stats``
  (``instance_cost``, ``api_calls``), ``config``, ``mini_version``; top-level
  ``instance_id`` (SWE-bench runs) and ``trajectory_format``.
- ``messages``, in one of three layouts:

  * 2.x (``trajectory_format: mini-swe-agent-1.1``): every model call's message carries
    ``extra`` with ``actions`` (the parsed commands), ``response`` (the raw API response,
    with ``usage``), ``cost`` and ``timestamp`` (when the reply arrived); observations
    (``role: tool`` with ``tool_call_id``, or ``user`` for text-based models, or a
    Responses-API ``function_call_output``) carry ``extra.timestamp`` (when the command
    finished) and ``returncode``. A reply that fails to parse is *not* kept: the agent
    appends a ``user`` message with ``extra.interrupt_type: FormatError`` holding the
    billed ``response``. The run ends with a ``role: exit`` message.
  * 1.17 (``mini-swe-agent-1``): ``role``/``content`` plus a top-level ``timestamp`` on
    every message, and ``extra.response`` on assistant messages; a reply that fails to
    parse stays as an assistant message, followed by the format-error ``user`` message.
  * 1.0-1.16 (``mini-swe-agent-1``): ``role``/``content`` only.

Mapping (one row per model call):

- Turns are the model calls: 2.x messages with ``extra.actions`` and FormatError messages (a
  billed call whose output failed to parse is still a turn; it ran nothing, so its env time
  is 0 s, as for a reply with no command); in 1.x every assistant message.
- ``prompt_tokens``: with recorded usage (``usage.prompt_tokens``/``input_tokens``), the
  context the API read minus the previous call's context and its output (the output of an
  unparsable 2.x reply is not kept in the context); otherwise, or where that difference is
  negative, the counted text of the messages since the previous call. ``output_tokens``:
  ``usage.completion_tokens``/``output_tokens``, else the counted reply (content,
  reasoning, tool-call arguments). ``token_source`` is ``recorded:usage`` where both came
  from usage.
- ``env_seconds``: the last timestamp among the messages after the call minus the call's
  timestamp (2.x: ``extra.timestamp``; 1.17: ``timestamp``); without timestamps (1.0-1.16,
  or a 2.x submit whose exit message has none) estimated from the command
  (``env_estimated``).
- ``task_id``: ``instance_id``, else the file name; ``trajectory_id``: the file name
  without ``.traj.json``. ``truncated``: the exit status is not ``Submitted`` (a missing
  status means the run was cut off). No reward: mini-swe-agent evaluates elsewhere.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from rlsched.cluster.errors import TraceError
from rlsched.traces.import_common import (
    RECORDED_SOURCE,
    ImportedTrajectory,
    as_list,
    elapsed,
    read_bytes_text,
    shape_of,
    timestamp_seconds,
    usage_prompt_deltas,
    whole_number,
)
from rlsched.traces.schema import json_name, json_problem
from rlsched.traces.tokens import TokenCounter, count_all, text_of

SUFFIXES = (".json",)
WHAT = "a mini-swe-agent trajectory (.traj.json with messages and info)"
FORMAT = "mini-swe-agent"
#: What the agent's submit command prints first (2.x, and 1.x's older spelling).
_SUBMIT_MARKS = ("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "MINI_SWE_AGENT_FINAL_OUTPUT")
_BLOCK = re.compile(r"```(?:bash|mswea_bash_command)\s*\n(.*?)\n```", re.S)


def _extra(msg: dict) -> dict:
    return msg["extra"] if isinstance(msg.get("extra"), dict) else {}


def _is_format_error(msg: dict) -> bool:
    return _extra(msg).get("interrupt_type") == "FormatError"


def _usage(obj: Any) -> tuple[int | None, int | None] | None:
    usage = obj.get("usage") if isinstance(obj, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt = whole_number(usage.get("prompt_tokens", usage.get("input_tokens")))
    output = whole_number(usage.get("completion_tokens", usage.get("output_tokens")))
    return (prompt, output) if prompt is not None or output is not None else None


def _output_items_text(items: Any) -> list[str]:
    """Text of a Responses-API ``output`` list: messages, reasoning summaries, calls."""
    texts: list[str] = []
    for item in as_list(items):
        if not isinstance(item, dict):
            continue
        texts += [text_of(item.get("content")), text_of(item.get("summary")),
                  text_of(item.get("name")), text_of(item.get("arguments"))]
    return texts


def _reply_texts(msg: dict) -> list[str]:
    """What the model wrote in a kept reply (chat message or Responses-API dump)."""
    texts = [text_of(msg.get("content")), text_of(msg.get("reasoning_content"))]
    for call in as_list(msg.get("tool_calls")):
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            texts += [text_of(fn.get("name")), text_of(fn.get("arguments"))]
    return texts + _output_items_text(msg.get("output"))


def _failed_reply_texts(msg: dict) -> list[str]:
    """What the model wrote in a reply that failed to parse (2.x FormatError message)."""
    extra = _extra(msg)
    response = extra.get("response")
    if isinstance(response, dict):
        choices = response.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            inner = choices[0].get("message")
            if isinstance(inner, dict):
                return _reply_texts(inner)
        return _output_items_text(response.get("output"))
    return [text_of(extra.get("model_response"))]


def _input_text(msg: dict) -> str:
    if msg.get("type") == "function_call_output":
        return text_of(msg.get("output"))
    return text_of(msg.get("content"))


def _stamp(msg: dict, v2: bool) -> float | None:
    return timestamp_seconds(_extra(msg).get("timestamp") if v2 else msg.get("timestamp"))


def _action(msg: dict, v2: bool) -> str:
    """The commands a reply asked to run, for the env-time estimate."""
    if v2:
        actions = as_list(_extra(msg).get("actions"))
        commands = [text_of(a.get("command")) for a in actions if isinstance(a, dict)]
        text = "\n".join(c for c in commands if c)
    else:
        blocks = _BLOCK.findall(text_of(msg.get("content")))
        text = blocks[-1].strip() if blocks else ""
    return "submit" if any(mark in text for mark in _SUBMIT_MARKS) else text


def _load(path: Path) -> Any:
    text = read_bytes_text(path, WHAT)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        cut = " (truncated file?)" if err.pos >= len(text.rstrip()) else ""
        raise TraceError(f"{path}: invalid JSON{cut}: {json_problem(err)} at line {err.lineno} column "
                         f"{err.colno} — expected {WHAT}") from None


def _not_a_trajectory(path: Path, doc: Any) -> TraceError:
    if isinstance(doc, dict) and doc and all(
            isinstance(v, dict) and "model_patch" in v for v in doc.values()):
        return TraceError(f"{path}: a predictions file (instance id -> model_patch), no "
                          f"messages — expected {WHAT}; the trajectories are the "
                          f"<instance_id>/<instance_id>.traj.json files")
    return TraceError(f"{path}: {shape_of(doc, expected_format=FORMAT)} — expected {WHAT}")


def read_trajectory(path: Path, doc: Any, counter: TokenCounter) -> ImportedTrajectory:
    """One loaded ``.traj.json`` document -> one trajectory (errors name ``path``)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
        raise _not_a_trajectory(path, doc)
    msgs = doc["messages"]
    for i, msg in enumerate(msgs):
        if not isinstance(msg, dict):
            raise TraceError(f"{path}: messages[{i}] is a JSON {json_name(msg)} — expected "
                             f"a message object")
    v2 = doc.get("trajectory_format") == "mini-swe-agent-1.1" or any(
        "actions" in _extra(m) for m in msgs)
    if v2:
        calls = [i for i, m in enumerate(msgs) if "actions" in _extra(m) or _is_format_error(m)]
    else:
        calls = [i for i, m in enumerate(msgs) if m.get("role") == "assistant"]
    if not calls:
        roles = sorted({str(m.get("role", m.get("type", "?"))) for m in msgs})
        raise TraceError(f"{path}: no model call in its {len(msgs)} messages (roles "
                         f"{', '.join(roles) or 'none'}) — expected {WHAT}")
    failed = [v2 and _is_format_error(msgs[i]) for i in calls]
    usages = [_usage(_extra(msgs[i]).get("response")) or _usage(msgs[i]) for i in calls]
    totals = [u[0] if u else None for u in usages]
    outs = [u[1] if u else None for u in usages]
    deltas = usage_prompt_deltas(totals, outs, [not f for f in failed])
    prompt, output, env, actions, sources = [], [], [], [], []
    prev = -1
    for k, i in enumerate(calls):
        msg = msgs[i]
        before = [_input_text(m) for m in msgs[prev + 1:i] if m.get("role") != "exit"]
        if k and failed[k - 1]:
            before.append(_input_text(msgs[calls[k - 1]]))  # the error text the model read
        counted_out = outs[k] if outs[k] is not None else count_all(
            counter, _failed_reply_texts(msg) if failed[k] else _reply_texts(msg))
        prompt.append(deltas[k] if deltas[k] is not None else count_all(counter, before))
        output.append(counted_out)
        both = deltas[k] is not None and outs[k] is not None
        sources.append(RECORDED_SOURCE if both else counter.source)
        nxt = calls[k + 1] if k + 1 < len(calls) else len(msgs)
        after = msgs[i + 1:nxt]
        if failed[k] or (v2 and not _extra(msg).get("actions")):
            env.append(0.0)  # nothing was executed
            actions.append("")
        else:
            stamps = [s for s in (_stamp(m, v2) for m in after) if s is not None]
            env.append(elapsed(_stamp(msg, v2), max(stamps)) if stamps else math.nan)
            actions.append(_action(msg, v2))
        prev = i
    info = doc.get("info") if isinstance(doc.get("info"), dict) else {}
    status = info.get("exit_status")
    if status in (None, ""):
        status = _extra(msgs[-1]).get("exit_status")
    status = str(status) if status not in (None, "") else None
    instance = doc.get("instance_id")
    stem = path.name.removesuffix(".json").removesuffix(".traj")
    return ImportedTrajectory(
        task_id=str(instance) if isinstance(instance, str) and instance.strip() else stem,
        trajectory_id=stem, prompt_tokens=tuple(prompt), output_tokens=tuple(output),
        env_seconds=tuple(env), actions=tuple(actions),
        truncated=status is None or status.strip().lower() != "submitted",
        exit_status=status, token_sources=tuple(sources))


def read_file(path: Path, counter: TokenCounter
              ) -> tuple[list[ImportedTrajectory], list[tuple[str, str]]]:
    """Importer entry point: one file, one trajectory (errors skip the whole file)."""
    return [read_trajectory(path, _load(path), counter)], []
