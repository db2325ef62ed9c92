"""Import SWE-agent ``.traj`` files (one trajectory per file) as trace rows.

What a ``.traj`` holds (read from SWE-agent's public source, repository
``SWE-agent/SWE-agent``: ``sweagent/types.py`` (``TrajectoryStep``, ``HistoryItem``,
``AgentInfo``) and ``sweagent/agent/agents.py`` (``get_trajectory_data``,
``add_step_to_trajectory``, ``forward_with_handling``, ``handle_submission``) on main after
v1.1.0; ``sweagent/agent/agents.py`` and ``sweagent/environment/swe_env.py`` at tags v0.4.0,
v0.6.0 and v0.7.0; the docs page ``docs/usage/trajectories.md``; and the example files under
``tests/test_data/trajectories/``). A JSON object with:

- ``trajectory``: one step per model call, each with ``response`` (the model's raw output),
  ``thought`` and ``action`` (parsed from it), ``observation`` (what the environment
  returned), ``state``; since 0.7 also ``execution_time`` (seconds the action ran; some
  files store it as a numeric string); 1.0 adds ``messages`` and 1.1 replaces it with
  ``query`` (the exact model input of the step) and ``extra_info``.
- ``history``: the chat messages (``role``, ``content`` -- a string, or in 1.x possibly a
  list of content parts -- ``agent``, and ``is_demo`` on demonstration messages; 1.x adds
  ``message_type``, ``tool_calls``, ``tool_call_ids``).
- ``info``: ``exit_status`` (``submitted``, ``exit_cost``, ``exit_context``,
  ``exit_format``, ``exit_error``, ``exit_api``, ``exit_total_execution_time``,
  ``exit_command_timeout``, ``exit_environment_error``, ``exit_forfeit``, ``early_exit``,
  ``exit_command``, or an autosubmission ``submitted (exit_cost)``...), ``submission``,
  ``model_stats``.
- ``environment``: the environment's name -- ``swe_main`` in 0.x, ``main`` by default in
  1.x, so it rarely names the task; 1.x also writes ``replay_config`` (a JSON string, or an
  object) whose ``problem_statement.id`` is the instance id. SWE-agent names the file
  ``<instance_id>.traj`` in every version.

Mapping (one row per model call that produced an action):

- ``task_id``: ``replay_config.problem_statement.id``, else ``environment`` unless it is a
  generic name (``main``, ``swe_main``), else the file name without ``.traj``.
  ``trajectory_id``: the file name without ``.traj`` (made unique across an import).
- ``output_tokens``: the step's ``response``, plus its ``action`` when the response does not
  contain it (1.x function calling keeps the tool call out of the response text); a step
  without ``response`` counts ``thought`` and ``action``.
- ``prompt_tokens``: turn 0 counts every history message of the main agent before its first
  own (non-demonstration) assistant message -- system prompt, demonstrations (they are in
  the context the model prefilled) and the instance prompt; without ``history``, the first
  step's ``query``. Turn k > 0 counts the observation of step k-1 (the text the scaffold
  appended next; the few template tokens it wraps around it are not counted).
- ``env_seconds``: the step's ``execution_time``; when absent (files before 0.7) the value
  is estimated from the action (``env_estimated``; see :mod:`~rlsched.traces.envtime`).
- ``truncated``: the exit status means the scaffold stopped the run (cost, context, time,
  format or error exits, also when autosubmitted); a file without an exit status was cut
  off mid-run and is truncated too (see ``import_common.exit_truncates``).
- The extra step SWE-agent appends when it stops a run on an error or limit (its response is
  the scaffold's own "Exit due to ..." message and its action empty or ``exit_*``; no model
  call) is not a turn and is dropped.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rlsched.cluster.errors import TraceError
from rlsched.traces.import_common import ImportedTrajectory, exit_truncates
from rlsched.traces.schema import json_name, json_problem
from rlsched.traces.tokens import TokenCounter, count_all, text_of

SUFFIXES = (".traj",)
GENERIC_ENV_NAMES = frozenset({"", "main", "swe_main", "default"})
_SCAFFOLD_EXIT_PREFIXES = ("exit due to", "exiting due to")


def _load_json(path: Path) -> Any:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise TraceError(f"{path}: cannot be read ({err.strerror}) — expected a SWE-agent "
                         f".traj file") from None
    if not data.strip():
        raise TraceError(f"{path}: empty file — expected a SWE-agent .traj JSON file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise TraceError(f"{path}: byte {err.start} is not UTF-8 — expected a SWE-agent .traj "
                         f"JSON file") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        if err.msg.startswith("Extra data") and text.lstrip().startswith("{"):
            raise TraceError(f"{path}: several JSON values, one per line (JSON lines?) — "
                             f"expected one SWE-agent .traj object (for chat transcripts use "
                             f"--format messages)") from None
        cut = " (truncated file?)" if err.pos >= len(text.rstrip()) else ""
        raise TraceError(f"{path}: invalid JSON{cut}: {json_problem(err)} at line {err.lineno} column "
                         f"{err.colno} — expected a SWE-agent .traj JSON file") from None


def _str_field(step: dict, key: str) -> str:
    value = step.get(key)
    return text_of(value) if value is not None else ""


def _seconds(path: Path, index: int, step: dict) -> float:
    """``execution_time`` as float seconds; NaN when the step has none."""
    if "execution_time" not in step or step["execution_time"] is None:
        return math.nan
    raw = step["execution_time"]
    try:
        value = float(raw) if not isinstance(raw, bool) else math.nan
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{path}: trajectory step {index}: execution_time {raw!r} — expected "
                         f"seconds >= 0")
    return value


def _is_scaffold_exit(step: dict) -> bool:
    """The step SWE-agent adds when it ends a run itself (no model call behind it)."""
    said = (_str_field(step, "response") or _str_field(step, "thought")).strip().lower()
    action = _str_field(step, "action").strip().lower()
    return said.startswith(_SCAFFOLD_EXIT_PREFIXES) and (not action or action.startswith("exit"))


def _task_id(path: Path, doc: dict) -> str:
    replay = doc.get("replay_config")
    if isinstance(replay, str):
        try:
            replay = json.loads(replay)
        except json.JSONDecodeError:
            replay = None
    if isinstance(replay, dict):
        ps = replay.get("problem_statement")
        if isinstance(ps, dict) and isinstance(ps.get("id"), str) and ps["id"].strip():
            return ps["id"].strip()
    env = doc.get("environment")
    if isinstance(env, str) and env.strip().lower() not in GENERIC_ENV_NAMES:
        return env.strip()
    return path.stem


def _task_prompt_texts(path: Path, doc: dict, steps: list[dict]) -> list[str]:
    """Texts the model read before its first own turn: system, demos, instance prompt."""
    history = doc.get("history")
    if isinstance(history, list) and history:
        if not all(isinstance(h, dict) for h in history):
            raise TraceError(f"{path}: 'history' holds non-objects — expected chat messages "
                             f"with role and content")
        agent = history[0].get("agent")
        texts: list[str] = []
        for item in history:
            if agent is not None and item.get("agent", agent) != agent:
                continue
            if item.get("role") == "assistant" and not item.get("is_demo", False):
                return texts
            texts.append(text_of(item.get("content")))
        return texts
    query = steps[0].get("query") if steps else None
    if isinstance(query, list) and query:
        texts = []
        for item in query:
            if not isinstance(item, dict):
                continue
            if item.get("role") == "assistant" and not item.get("is_demo", False):
                break
            texts.append(text_of(item.get("content")))
        return texts
    raise TraceError(f"{path}: no 'history' and no 'query' on the first step — expected the "
                     f"messages of the task prompt to count its tokens")


def read_swe_agent(path: Path, counter: TokenCounter) -> ImportedTrajectory:
    """Read one ``.traj`` file; raises :class:`TraceError` naming the file when it is not one."""
    doc = _load_json(path)
    if not isinstance(doc, dict):
        hint = (" (a list of chat transcripts? use --format messages)"
                if isinstance(doc, list) else "")
        raise TraceError(f"{path}: a JSON {json_name(doc)}{hint} — expected a SWE-agent "
                         f".traj object with 'trajectory', 'history' and 'info'")
    steps = doc.get("trajectory")
    if not isinstance(steps, list):
        keys = ", ".join(sorted(map(str, doc))[:6]) or "none"
        hint = (" (a chat transcript? use --format messages)"
                if {"messages", "conversations"} & set(doc) else "")
        raise TraceError(f"{path}: no 'trajectory' list (keys: {keys}){hint} — expected a "
                         f"SWE-agent .traj file")
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            raise TraceError(f"{path}: trajectory step {i} is a JSON {json_name(step)} — "
                             f"expected an object with response, action and observation")
    turns = [(i, s) for i, s in enumerate(steps) if not _is_scaffold_exit(s)]
    if not turns:
        raise TraceError(f"{path}: no model turns in 'trajectory' ({len(steps)} steps, none "
                         f"with a model response) — expected at least one step")

    info = doc.get("info") if isinstance(doc.get("info"), dict) else {}
    status = info.get("exit_status")
    status = str(status) if status is not None else None

    prompt = [count_all(counter, _task_prompt_texts(path, doc, steps))]
    output: list[int] = []
    env: list[float] = []
    actions: list[str] = []
    for k, (i, step) in enumerate(turns):
        response = _str_field(step, "response")
        action = _str_field(step, "action")
        if response:
            pieces = [response] if action.strip() in response else [response, action]
        else:
            pieces = [_str_field(step, "thought"), action]
        output.append(count_all(counter, pieces))
        env.append(_seconds(path, i, step))
        actions.append(action)
        if k + 1 < len(turns):
            prompt.append(counter.count(_str_field(step, "observation")))
    return ImportedTrajectory(
        task_id=_task_id(path, doc),
        trajectory_id=path.stem,
        prompt_tokens=tuple(prompt),
        output_tokens=tuple(output),
        env_seconds=tuple(env),
        actions=tuple(actions),
        truncated=exit_truncates(status, missing=True),
        exit_status=status,
    )


def read_file(path: Path, counter: TokenCounter
              ) -> tuple[list[ImportedTrajectory], list[tuple[str, str]]]:
    """Importer entry point: one file, one trajectory (errors skip the whole file)."""
    return [read_swe_agent(path, counter)], []
