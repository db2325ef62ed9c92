"""Import verl rollout dumps (``trainer.rollout_data_dir``: ``<step>.jsonl``, one rollout per
line).

What a line holds (read from verl's public source, repository ``volcengine/verl``:
``verl/trainer/ppo/ray_trainer.py`` (``_log_rollout_data``, ``_dump_generations``),
``verl/experimental/agent_loop/tool_agent_loop.py`` (how a multi-turn response is built:
the model's tokens, then the tool messages rendered with the chat template and a generation
prompt, masked out of the loss), ``docs/sglang_multiturn/sandbox_fusion.rst`` (a documented
sample line) and ``scripts/rollout_viewer.py``):

- ``input``: the prompt, decoded with ``skip_special_tokens=True`` (so chat-template markers
  such as ``<|im_start|>`` are gone and only the role names remain);
- ``output``: the whole response the same way -- for a multi-turn agent loop, every
  assistant turn *and* the tool responses between them;
- ``score``: the summed token-level reward; ``step``: the RL step (also the file name);
  ``gts``: the ground truth; plus every ``reward_extra_info`` key (``acc``, ``request_id``...).

The dump holds no timing, no token counts and no prompt id, so every number below is
derived, and the README says so.

Turns: the output is split at the chat template's tool-response boundaries. A boundary is
a tool-response block that follows the end of a generation (a ``</tool_call>``, or an
end-of-turn token when special tokens were kept) and runs up to the next ``assistant``
header:

- Qwen2.5/Qwen3 (Hermes tool calls, verl's multi-turn examples): ``user`` +
  ``<tool_response>...</tool_response>`` blocks (several consecutive tool results are one
  block), with or without ``<|im_start|>``/``<|im_end|>``;
- a ``tool`` / ``ipython`` / ``observation`` role header (the documented SGLang sample;
  Llama 3 with ``<|start_header_id|>`` kept).

Other templates (gpt-oss harmony, templates whose role names vanish with the special
tokens) are not recognised: such an output imports as one turn.

Mapping (one row per assistant turn):

- ``prompt_tokens``: turn 0 the ``input``; turn k the tool-response block before it (role
  headers included). ``output_tokens``: the assistant text of the turn (a leading
  ``assistant`` header, which old dumps include, is not counted). Counted with
  ``--tokenizer DIR`` (the model's ``tokenizer.json``: exact for the text, minus the few
  special tokens the decode dropped per turn) or the ``chars/4`` estimate; ``token_source``
  says which on every row.
- ``env_seconds``: every turn followed by a tool response is estimated from its tool call
  with :mod:`~rlsched.traces.envtime` (``env_estimated``; a code-execution tool counts as
  running a script); the last turn ran no tool: 0 s.
- ``task_id``: ``uid`` when the dump has it, else ``prompt-`` + a hash of ``input`` (the
  GRPO samples of one prompt share it); ``trajectory_id``: ``<file stem>:<line>``;
  ``step``: ``step`` (so a replay draws the recorded batches), or for a line without it
  the file's name ``<step>.jsonl``; ``reward``: ``score``.
- ``truncated``: the last turn ends in a tool call nothing answered (the turn or length
  limit stopped the loop) or inside an unclosed ``<tool_call>``/``<think>``.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

from rlsched.cluster.errors import TraceError
from rlsched.traces.import_common import ImportedTrajectory, read_records, shape_of
from rlsched.traces.schema import json_name
from rlsched.traces.tokens import TokenCounter, text_of

SUFFIXES = (".jsonl",)
WHAT = "a verl rollout dump (<step>.jsonl lines with input, output and score)"
FORMAT = "verl"

_END = r"(?:<\|im_end\|>|<\|eot_id\|>|<\|eom_id\|>|<\|end\|>)"
_OPEN = r"(?:<\|im_start\|>|<\|start_header_id\|>)"
_HDR = r"(?:<\|end_header_id\|>)?"
#: Where a tool-response block can start: right after the end of a generation (a closed
#: tool call, or an end-of-turn token when special tokens were kept), at a role header.
_BLOCK_START = re.compile(
    rf"(?:(?P<call></tool_call>){_END}?|{_END})[ \t\n]*{_OPEN}?"
    rf"(?P<role>user|tool|ipython|observation){_HDR}\n")
#: The assistant header that ends a tool-response block (a generation prompt).
_ASSISTANT_HEADER = re.compile(rf"(?<=[\n>]){_OPEN}?assistant{_HDR}\n")
_LEADING_HEADER = re.compile(rf"^\s*{_OPEN}?assistant{_HDR}\n")
_TOOL_RESPONSE = re.compile(r"\s*<tool_response>")
_OPEN_CALL, _CLOSE_CALL = "<tool_call>", "</tool_call>"


def split_turns(output: str) -> list[tuple[str, str]]:
    """``(assistant text, tool-response text after it)`` per turn; the last turn's tool
    text is empty.

    One pass, linear in the text: a block starts at a role header right after the end of a
    generation (a ``user`` header only when a ``<tool_response>`` follows, so a simulated
    user's reply is not taken for a tool's) and runs through the next ``assistant`` header.
    A block with no assistant header after it (the length limit cut the response inside a
    tool response) is left in the last turn's text.
    """
    header = _LEADING_HEADER.match(output)
    pos = header.end() if header else 0
    headers = [m.end() for m in _ASSISTANT_HEADER.finditer(output)]
    starts = [m.start() for m in _ASSISTANT_HEADER.finditer(output)]
    turns: list[tuple[str, str]] = []
    search = pos
    while True:
        m = _BLOCK_START.search(output, search)
        if m is None:
            break
        if m.group("role") == "user" and not _TOOL_RESPONSE.match(output, m.end()):
            search = m.end()
            continue
        k = bisect.bisect_left(starts, m.end())
        if k == len(starts):
            break
        block_start = m.start() + (len("</tool_call>") if m.group("call") else 0)
        turns.append((output[pos:block_start], output[block_start:headers[k]]))
        pos = search = headers[k]
    turns.append((output[pos:], ""))
    return turns


def _last_call(text: str) -> str | None:
    """The body of the last complete ``<tool_call>...</tool_call>`` (string search, so a
    degenerate output of many unclosed tags stays linear)."""
    close = text.rfind(_CLOSE_CALL)
    if close < 0:
        return None
    opened = text.rfind(_OPEN_CALL, 0, close)
    return None if opened < 0 else text[opened + len(_OPEN_CALL):close].strip()


def _action(assistant: str) -> str:
    """The tool work a turn asked for, phrased for the env-time classes."""
    body = _last_call(assistant)
    if body is None:
        return ""
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return body
    if not isinstance(call, dict):
        return body
    name = text_of(call.get("name"))
    args = call.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return f"{name} {args}"
    if isinstance(args, dict):
        for key in ("command", "cmd", "script"):
            if isinstance(args.get(key), str):
                return args[key]
        if isinstance(args.get("code"), str):  # a code interpreter runs the code as a script
            return f"python {args['code']}"
    return name


def _task_id(rec: dict) -> str:
    for key in ("uid", "prompt_id", "index"):
        value = rec.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
    digest = hashlib.blake2b(rec["input"].encode("utf-8"), digest_size=6).hexdigest()
    return f"prompt-{digest}"


def _score(rec: dict, where: str) -> float:
    if "score" not in rec or rec["score"] is None:
        return math.nan
    value = rec["score"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TraceError(f"{where}: score {value!r} — expected a finite number")
    return float(value)


def _step(rec: dict, where: str, default: int | None = None) -> int | None:
    """The line's ``step``; ``default`` (its file's step, from the name ``<step>.jsonl``)
    when it records none."""
    if "step" not in rec or rec["step"] is None:
        return default
    value = rec["step"]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**62:
        raise TraceError(f"{where}: step {value!r} — expected a whole number >= 0 (below "
                         f"2**62)")
    return value


def read_record(rec: Any, where: str, default_id: str,
                counter: TokenCounter, default_step: int | None = None) -> ImportedTrajectory:
    """One dump line -> one trajectory; ``where`` (file:line) names it in errors;
    ``default_step``: the step of a line that records none (its file's)."""
    if isinstance(rec, dict) and {"input", "output"} <= rec.keys():
        for key in ("input", "output"):
            if not isinstance(rec[key], str):
                raise TraceError(f"{where}: '{key}' is a JSON {json_name(rec[key])} — "
                                 f"expected decoded text (token ids cannot be split into turns)")
    if not isinstance(rec, dict) or not isinstance(rec.get("input"), str) or not isinstance(
            rec.get("output"), str):
        raise TraceError(f"{where}: {shape_of(rec, expected_format=FORMAT)} — expected a verl "
                         f"rollout dump line with text 'input' and 'output'")
    turns = split_turns(rec["output"])
    prompt = [counter.count(rec["input"])] + [counter.count(tool) for _, tool in turns[:-1]]
    output = [counter.count(text) for text, _ in turns]
    env = [math.nan if tool else 0.0 for _, tool in turns]
    actions = [_action(text) if tool else "" for text, tool in turns]
    last = turns[-1][0]
    if _last_call(last) is not None:
        status: str | None = "unanswered tool call"
    elif last.count(_OPEN_CALL) > last.count(_CLOSE_CALL) or last.count(
            "<think>") > last.count("</think>"):
        status = "cut mid-generation"
    else:
        status = None
    return ImportedTrajectory(
        task_id=_task_id(rec), trajectory_id=default_id, prompt_tokens=tuple(prompt),
        output_tokens=tuple(output), env_seconds=tuple(env), actions=tuple(actions),
        truncated=status is not None, reward=_score(rec, where), exit_status=status,
        step=_step(rec, where, default_step))


def file_step(path: Path) -> int | None:
    """The step a dump file's name gives (verl writes ``<step>.jsonl``), or None for any
    other name."""
    stem = path.stem
    return int(stem) if stem.isascii() and stem.isdigit() and len(stem) < 19 else None


def read_file(path: Path, counter: TokenCounter
              ) -> tuple[list[ImportedTrajectory], list[tuple[str, str]]]:
    """Importer entry point: every good line is a trajectory, every bad line a skip. A line
    without ``step`` takes its file's (``<step>.jsonl``): verl writes the field on every
    line, but a dump edited or merged by hand may lack it on some, and one trajectory
    without a step dropped the column from the whole import (a replay then drew batches at
    random instead of the recorded ones)."""
    step = file_step(path)
    return read_records(path, WHAT, lambda rec, where, line: read_record(
        rec, where, f"{path.stem}:{line}", counter, step))
