"""Import OpenHands evaluation output (``output.jsonl``: one evaluated instance per line).

What a line holds (read from OpenHands' public source: ``evaluation/utils/shared.py``
(``EvalOutput``, ``get_metrics``), ``openhands/events/serialization/event.py``
(``event_to_dict``), ``openhands/core/schema/action.py`` (action types),
``openhands/llm/metrics.py`` (``Metrics.get``, ``TokenUsage``) and the CodeAct
``function_calling.py`` of the V0 code in ``OpenHands/OpenHands``; and for the V1 harness,
``benchmarks/utils/models.py`` (``EvalOutput``) in ``OpenHands/benchmarks`` with the event
classes of ``openhands-sdk/openhands/sdk/event/`` in ``OpenHands/software-agent-sdk``):

- ``instance_id``, ``instruction``, ``test_result`` (``git_patch``; after the SWE-bench
  evaluation also ``report.resolved``), ``metadata``, ``metrics`` (``token_usages``: one
  entry per LLM call with ``prompt_tokens``, ``completion_tokens`` and ``response_id``),
  ``error`` (the controller's last error: iteration or budget limit, stuck loop, runtime
  failure), ``instance``; V1 adds ``attempt``.
- ``history``, the event stream. V0 events are dicts with ``id``, ``timestamp`` (ISO),
  ``source`` (agent/user/environment) and either ``action`` + ``args`` (``run`` with
  ``command``, ``run_ipython``, ``edit``, ``read``, ``message``, ``finish``, ``think``,
  ``system``...) with ``tool_call_metadata.model_response`` (the raw LLM response, with
  ``id`` and ``usage``) on function-calling actions, or ``observation`` + ``content`` +
  ``extras`` with ``cause`` (the id of the action it answers). The oldest outputs store
  ``history`` as ``[action, observation]`` pairs. V1 events carry ``kind``:
  ``SystemPromptEvent``, ``MessageEvent`` (``llm_message``), ``ActionEvent`` (``thought``,
  ``action``, ``tool_name``, ``tool_call``, ``llm_response_id``), ``ObservationEvent``
  (``observation``, ``action_id``), ``AgentErrorEvent``, ``UserRejectObservation``.

Mapping (one row per LLM call):

- A turn is one LLM response: the agent actions that share a response id
  (``tool_call_metadata.model_response.id`` / ``llm_response_id``: parallel tool calls of
  one response are one turn); an agent action without one is a turn of its own. The
  system prompt, recall actions and state changes are not model calls.
- ``prompt_tokens``: with recorded usage (the response's ``usage``, else the
  ``metrics.token_usages`` entry of its response id) the context the API read minus the
  previous call's context and output; otherwise, and where that difference is negative (a
  condenser shrank the context), the counted text of the events since the previous call
  (turn 0: system prompt, tool schemas, the instruction). ``output_tokens``: the usage's
  ``completion_tokens``, else the counted thought and tool-call text. ``token_source`` is
  ``recorded:usage`` on rows where both came from usage.
- ``env_seconds``: from the first action of the turn to the last observation that answers
  it (``cause`` / ``action_id`` / ``tool_call_id``), from the timestamps; a turn that ran
  no tool (message, think, finish) is 0 s; otherwise estimated from the action
  (``env_estimated``).
- ``task_id`` and ``trajectory_id``: ``instance_id`` (``#<attempt>`` for a V1 retry).
- ``reward``: ``test_result.report.resolved`` (or ``test_result.resolved``/``success``) as
  1/0; unknown before the evaluation ran. ``truncated``: the run has an ``error`` or never
  reached a ``finish``; ``exit_status``: ``finish`` or the error's first line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlsched.cluster.errors import TraceError
from rlsched.traces.import_common import (
    RECORDED_SOURCE,
    ImportedTrajectory,
    as_list,
    elapsed,
    read_records,
    shape_of,
    timestamp_seconds,
    usage_prompt_deltas,
    whole_number,
)
from rlsched.traces.schema import json_name
from rlsched.traces.tokens import TokenCounter, count_all, text_of

SUFFIXES = (".jsonl",)
WHAT = "OpenHands evaluation output (JSON lines with instance_id and history)"
FORMAT = "openhands"

#: V0 agent-side action types that are not an LLM call.
_NOT_CALLS = frozenset({"system", "recall", "change_agent_state", "condensation",
                        "condensation_request", "null", "pause", "resume", "stop", "start"})
#: V0 actions that run nothing in the environment.
_NO_ENV_ACTIONS = frozenset({"message", "finish", "reject", "think"})
_FINISH_ACTIONS = frozenset({"finish", "reject"})
#: V1 tools that run nothing in the environment.
_NO_ENV_TOOLS = frozenset({"finish", "think"})
_OBSERVATION_KINDS = frozenset({"ObservationEvent", "AgentErrorEvent", "UserRejectObservation"})
#: V0 ``args`` keys holding what the model wrote for an action.
_ARG_TEXT_KEYS = ("thought", "command", "code", "content", "file_text", "old_str", "new_str",
                  "insert_line", "path", "url", "browser_actions", "final_thought", "message",
                  "arguments", "task", "inputs")


@dataclass
class _Turn:
    """One LLM call being assembled from its events."""

    key: str | None
    prompt_texts: list[str]
    out_texts: list[str] = field(default_factory=list)
    links: set[str] = field(default_factory=set)
    start: float | None = None
    obs_end: float | None = None
    has_obs: bool = False
    no_env: bool = True
    action: str = ""
    usage: tuple[int | None, int | None] | None = None
    finish: bool = False


def _usage_of(usage: Any) -> tuple[int | None, int | None] | None:
    if not isinstance(usage, dict):
        return None
    prompt = whole_number(usage.get("prompt_tokens", usage.get("input_tokens")))
    completion = whole_number(usage.get("completion_tokens", usage.get("output_tokens")))
    if prompt is None and completion is None:
        return None
    return prompt, completion


def _response_text(response: dict) -> str:
    """What the model wrote in a raw chat-completions response (content, reasoning, calls)."""
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    msg = choices[0].get("message")
    if not isinstance(msg, dict):
        return ""
    texts = [text_of(msg.get("content")), text_of(msg.get("reasoning_content"))]
    for call in as_list(msg.get("tool_calls")):
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            texts += [text_of(fn.get("name")), text_of(fn.get("arguments"))]
    return "\n".join(t for t in texts if t)


def _v0_action_text(kind: str, args: dict) -> str:
    """The environment work of a V0 action, phrased for the env-time classes."""
    if kind == "run":
        return text_of(args.get("command"))
    if kind == "run_ipython":
        return f"ipython {text_of(args.get('code'))}"
    if kind in ("edit", "write"):
        return f"edit {text_of(args.get('path'))}"
    if kind == "read":
        return f"cat {text_of(args.get('path'))}"
    if kind in _FINISH_ACTIONS:
        return "submit"
    if kind in _NO_ENV_ACTIONS:
        return ""
    return kind


def _v1_action_text(ev: dict) -> str:
    tool = text_of(ev.get("tool_name"))
    action = ev.get("action") if isinstance(ev.get("action"), dict) else {}
    if tool == "finish":
        return "submit"
    if tool in _NO_ENV_TOOLS:
        return ""
    command = action.get("command")
    if isinstance(command, str) and command.strip():
        # The file editor's commands are view/create/str_replace/insert/undo_edit.
        return command if "edit" not in tool else f"str_replace_editor {command}"
    code = action.get("code")
    if isinstance(code, str):
        return f"ipython {code}"
    return tool


def _observation_text(obs: Any) -> str:
    if isinstance(obs, dict):
        for key in ("content", "output", "text", "error"):
            if obs.get(key) is not None:
                return text_of(obs[key])
        return ""
    return text_of(obs)


class _Builder:
    """Walks one history and collects its turns."""

    def __init__(self, usages: dict[str, tuple[int | None, int | None]]) -> None:
        self.usages = usages
        self.turns: list[_Turn] = []
        self.pending: list[str] = []
        self.by_link: dict[str, _Turn] = {}

    def add_input(self, text: str) -> None:
        self.pending.append(text)

    def add_call(self, *, key: str | None, links: list[str], when: float | None,
                 out_text: str, action: str, no_env: bool, finish: bool,
                 usage: tuple[int | None, int | None] | None) -> None:
        turn = self.turns[-1] if self.turns else None
        if turn is None or key is None or turn.key != key:
            turn = _Turn(key=key, prompt_texts=self.pending)
            self.pending = []
            self.turns.append(turn)
        # else: another tool call of the same response; the results seen since stay
        # pending -- they reach the model with the next call's prompt.
        if out_text:
            turn.out_texts.append(out_text)
        for link in links:
            if link:
                turn.links.add(link)
                self.by_link[link] = turn
        if when is not None:
            turn.start = when if turn.start is None else min(turn.start, when)
        turn.no_env = turn.no_env and no_env
        if action and not turn.action:
            turn.action = action
        if usage is None and key is not None:
            usage = self.usages.get(key)
        if usage is not None and turn.usage is None:
            turn.usage = usage
        turn.finish = turn.finish or finish

    def observe(self, link: str | None, when: float | None) -> None:
        turn = self.by_link.get(link) if link else None
        if turn is None:
            return
        turn.has_obs = True
        if when is not None:
            turn.obs_end = when if turn.obs_end is None else max(turn.obs_end, when)

    # --------------------------------------------------------------- V0 events
    def v0_event(self, ev: dict) -> None:
        when = timestamp_seconds(ev.get("timestamp"))
        if "action" in ev:
            kind = str(ev.get("action"))
            args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
            if kind == "system":
                self.add_input(text_of(args.get("content")))
                tools = args.get("tools")
                if isinstance(tools, list):
                    self.add_input(json.dumps(tools, ensure_ascii=False, sort_keys=True))
                return
            if ev.get("source") != "agent" or kind in _NOT_CALLS:
                if kind == "message":
                    self.add_input(text_of(args.get("content")))
                return
            meta = ev.get("tool_call_metadata")
            response = meta.get("model_response") if isinstance(meta, dict) else None
            response = response if isinstance(response, dict) else None
            key = None
            if response is not None and isinstance(response.get("id"), str):
                key = response["id"]
            elif isinstance(ev.get("response_id"), str):
                key = ev["response_id"]
            same = bool(self.turns) and key is not None and self.turns[-1].key == key
            if response is not None and not same:
                out_text = _response_text(response) or self._args_text(args)
            elif same and response is not None:
                out_text = ""  # the shared response was counted with its first action
            else:
                out_text = self._args_text(args)
            self.add_call(key=key, links=[str(ev.get("id", ""))], when=when, out_text=out_text,
                          action=_v0_action_text(kind, args), no_env=kind in _NO_ENV_ACTIONS,
                          finish=kind in _FINISH_ACTIONS,
                          usage=_usage_of(response.get("usage")) if response else None)
        elif "observation" in ev:
            if ev.get("observation") == "null":  # the old pair layout's "no observation"
                return
            self.add_input(text_of(ev.get("content")))
            cause = ev.get("cause")
            self.observe(str(cause) if cause is not None else None, when)

    @staticmethod
    def _args_text(args: dict) -> str:
        return "\n".join(t for t in (text_of(args.get(k)) for k in _ARG_TEXT_KEYS
                                     if args.get(k) not in (None, "", False, True)) if t)

    # --------------------------------------------------------------- V1 events
    def v1_event(self, ev: dict) -> None:
        kind = ev.get("kind") if isinstance(ev.get("kind"), str) else ""
        when = timestamp_seconds(ev.get("timestamp"))
        if kind == "SystemPromptEvent":
            self.add_input(text_of(ev.get("system_prompt")))
            if isinstance(ev.get("tools"), list):
                self.add_input(json.dumps(ev["tools"], ensure_ascii=False, sort_keys=True))
        elif kind == "MessageEvent":
            msg = ev.get("llm_message") if isinstance(ev.get("llm_message"), dict) else {}
            text = "\n".join(t for t in (text_of(msg.get("content")),
                                         text_of(msg.get("reasoning_content"))) if t)
            if ev.get("source") == "agent":
                key = ev.get("llm_response_id")
                self.add_call(key=key if isinstance(key, str) else None,
                              links=[str(ev.get("id", ""))], when=when, out_text=text,
                              action="", no_env=True, finish=False, usage=None)
            else:
                self.add_input(text)
        elif kind == "ActionEvent":
            call = ev.get("tool_call") if isinstance(ev.get("tool_call"), dict) else {}
            texts = [text_of(ev.get("thought")), text_of(ev.get("reasoning_content")),
                     text_of(call.get("name")), text_of(call.get("arguments"))]
            key = ev.get("llm_response_id")
            tool = text_of(ev.get("tool_name"))
            self.add_call(key=key if isinstance(key, str) else None,
                          links=[str(ev.get("id", "")), str(ev.get("tool_call_id", ""))],
                          when=when, out_text="\n".join(t for t in texts if t),
                          action=_v1_action_text(ev), no_env=tool in _NO_ENV_TOOLS,
                          finish=tool == "finish", usage=None)
        elif kind in _OBSERVATION_KINDS:
            if kind == "AgentErrorEvent":
                self.add_input(text_of(ev.get("error")))
            elif kind == "UserRejectObservation":
                self.add_input(text_of(ev.get("rejection_reason")))
            else:
                self.add_input(_observation_text(ev.get("observation")))
            link = ev.get("action_id") or ev.get("tool_call_id")
            self.observe(str(link) if link else None, when)
            if ev.get("tool_call_id"):
                self.observe(str(ev["tool_call_id"]), when)


def _usages(rec: dict) -> dict[str, tuple[int | None, int | None]]:
    metrics = rec.get("metrics")
    out: dict[str, tuple[int | None, int | None]] = {}
    if isinstance(metrics, dict) and isinstance(metrics.get("token_usages"), list):
        for entry in metrics["token_usages"]:
            if isinstance(entry, dict) and isinstance(entry.get("response_id"), str):
                usage = _usage_of(entry)
                if usage is not None and entry["response_id"]:
                    out.setdefault(entry["response_id"], usage)
    return out


def _events(rec: dict, where: str) -> tuple[list[dict], bool]:
    """The history as a flat list of event dicts, and whether it is V1 (``kind`` events)."""
    history = rec.get("history")
    if history is None:
        error = str(rec.get("error") or "").strip().splitlines()
        why = f" (error: {error[0][:120]})" if error else ""
        raise TraceError(f"{where}: no history{why} — expected the events of an agent run")
    if not isinstance(history, list):
        raise TraceError(f"{where}: 'history' is {shape_of(history, expected_format=FORMAT)} — "
                         f"expected the list of events of the run")
    events: list[dict] = []
    for i, item in enumerate(history):
        if isinstance(item, list | tuple) and len(item) == 2 and all(
                isinstance(x, dict) for x in item):  # old output: [action, observation] pairs
            action, obs = dict(item[0]), dict(item[1])
            action.setdefault("id", f"pair-{i}")
            obs.setdefault("cause", action["id"])
            events += [action, obs]
        elif isinstance(item, dict):
            events.append(item)
        else:
            raise TraceError(f"{where}: history[{i}] is a JSON {json_name(item)} — "
                             f"expected an event object (or an [action, observation] pair)")
    return events, any("kind" in ev for ev in events)


def _reward(rec: dict) -> float:
    result = rec.get("test_result") if isinstance(rec.get("test_result"), dict) else {}
    report = result.get("report") if isinstance(result.get("report"), dict) else {}
    top = rec.get("report") if isinstance(rec.get("report"), dict) else {}
    for holder, key in ((report, "resolved"), (top, "resolved"), (result, "resolved"),
                        (result, "success")):
        value = holder.get(key)
        if isinstance(value, bool):
            return 1.0 if value else 0.0
    return math.nan


def read_record(rec: Any, where: str, counter: TokenCounter) -> ImportedTrajectory:
    """One ``EvalOutput`` line -> one trajectory; ``where`` (file:line) names it in errors."""
    if not isinstance(rec, dict) or "history" not in rec:
        raise TraceError(f"{where}: {shape_of(rec, expected_format=FORMAT)} — expected an "
                         f"OpenHands EvalOutput with instance_id and history")
    instance = rec.get("instance_id")
    if not isinstance(instance, str | int) or isinstance(instance, bool) or not str(instance):
        raise TraceError(f"{where}: instance_id is {instance!r} — expected the instance's id")
    events, v1 = _events(rec, where)
    builder = _Builder(_usages(rec))
    for ev in events:
        (builder.v1_event if v1 else builder.v0_event)(ev)
    turns = builder.turns
    if not turns:
        raise TraceError(f"{where}: no LLM call in its history ({len(events)} events, no agent "
                         f"action) — expected at least one action of the agent")
    n = len(turns)
    totals = [t.usage[0] if t.usage else None for t in turns]
    outs = [t.usage[1] if t.usage else None for t in turns]
    deltas = usage_prompt_deltas(totals, outs, [True] * n)
    prompt, output, sources, env, actions = [], [], [], [], []
    for k, turn in enumerate(turns):
        recorded_in = deltas[k]
        recorded_out = outs[k]
        prompt.append(recorded_in if recorded_in is not None else count_all(counter, turn.prompt_texts))
        output.append(recorded_out if recorded_out is not None
                      else count_all(counter, turn.out_texts))
        both = recorded_in is not None and recorded_out is not None
        sources.append(RECORDED_SOURCE if both else counter.source)
        if turn.has_obs:
            env.append(elapsed(turn.start, turn.obs_end))
        else:
            env.append(0.0 if turn.no_env else math.nan)
        actions.append(turn.action)
    error = rec.get("error")
    error = str(error).strip() if error not in (None, "") else ""
    finished = any(t.finish for t in turns)
    status = "finish" if finished and not error else (
        error.splitlines()[0][:120] if error else "no finish action")
    attempt = rec.get("attempt")
    traj_id = str(instance) + (f"#{attempt}" if isinstance(attempt, int)
                               and not isinstance(attempt, bool) and attempt > 1 else "")
    return ImportedTrajectory(
        task_id=str(instance), trajectory_id=traj_id, prompt_tokens=tuple(prompt),
        output_tokens=tuple(output), env_seconds=tuple(env), actions=tuple(actions),
        truncated=bool(error) or not finished, reward=_reward(rec), exit_status=status,
        token_sources=tuple(sources))


def read_file(path: Path, counter: TokenCounter
              ) -> tuple[list[ImportedTrajectory], list[tuple[str, str]]]:
    """Importer entry point: every good line is a trajectory, every bad line a skip."""
    return read_records(path, WHAT, lambda rec, where, _line: read_record(rec, where, counter))
