"""One trajectory's multi-turn agent loop, as token bookkeeping the live driver advances.

The loop is: the engine generates a turn from the trajectory's token context -> the text
of that turn goes to the environment (real tool time) -> the observation is appended to
the context as prompt tokens -> next turn, until the environment says done or the turn
limit is hit. The driver owns *when* each of these happens (engines, threads, policy
commands); this module owns *what* the context is, so a migrated or interrupted
trajectory resumes from exactly its kept tokens.

Chat formatting: the context is built from the checkpoint's own chat template, rendered
once with sentinel messages to find the strings around a user message and between turns
(so a real checkpoint's format is used unchanged and the tiny model's template is just
another template). Generated tokens carry loss mask 1; prompt, observation and template
tokens carry 0.

Behaviour: each generated token also keeps the engine's log-probability of it and the
weights version that generated it (``behaviour_logprobs`` / ``token_versions``, aligned
with ``token_ids``; NaN / -1 at prompt, observation and template positions), so the trainer
can correct for staleness per token (``pg_loss.py``) -- a turn may straddle a weight sync
or a migration, and its tokens then carry different versions.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from rlsched.cluster.errors import LiveBackendError

_U1, _A1, _U2 = "\x00USER-ONE\x00", "\x00ASSISTANT-ONE\x00", "\x00USER-TWO\x00"


@dataclass(frozen=True)
class ChatFormat:
    """The strings the chat template puts around messages.

    ``first`` wraps the task prompt (``{}``) up to the assistant header, ``between`` goes
    from the end of an assistant turn to the next user message, ``after_user`` from a user
    message to the assistant header. ``eos`` is the text of the end token, which a turn
    that stopped on it already contains.
    """

    before_first: str
    after_user: str
    between: str
    eos: str

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> ChatFormat:
        path = Path(model_dir) / "tokenizer_config.json"
        try:
            cfg = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, json.JSONDecodeError) as exc:
            raise LiveBackendError(f"{path}: unreadable tokenizer config ({exc.__class__.__name__})") from None
        eos = _token_text(cfg.get("eos_token"))
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take the default
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        if not isinstance(template, str):
            return cls("", "\n", "\n", eos)
        bos = _token_text(cfg.get("bos_token"))
        one = _render(template, [("user", _U1)], bos, eos, path)
        two = _render(template, [("user", _U1), ("assistant", _A1), ("user", _U2)], bos, eos, path)
        try:
            before, after = one.split(_U1)
            between = two.split(_A1)[1].split(_U2)[0]
        except (ValueError, IndexError):
            raise LiveBackendError(f"{path}: chat_template does not render user/assistant messages") from None
        return cls(before, after, between, eos)

    def first(self, prompt: str) -> str:
        return self.before_first + prompt + self.after_user

    def observation(self, text: str, ended_with_eos: bool) -> str:
        between = self.between
        if ended_with_eos and self.eos and between.startswith(self.eos):
            between = between[len(self.eos):]
        return between + text + self.after_user


def _token_text(tok: object) -> str:
    if isinstance(tok, dict):
        return str(tok.get("content", ""))
    return tok if isinstance(tok, str) else ""


def _render(template: str, msgs: list[tuple[str, str]], bos: str, eos: str, path: Path) -> str:
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(
            messages=[{"role": r, "content": c} for r, c in msgs],
            add_generation_prompt=True, bos_token=bos, eos_token=eos,
        )
    except TemplateError as exc:
        raise LiveBackendError(f"{path}: chat_template failed to render ({exc})") from None


class Codec:
    """Text <-> token ids with the checkpoint's ``tokenizer.json`` (``tokenizers`` library)."""

    def __init__(self, model_dir: str | Path) -> None:
        from tokenizers import Tokenizer

        path = Path(model_dir) / "tokenizer.json"
        try:
            self.tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own Exception type
            raise LiveBackendError(f"{path}: cannot load tokenizer ({str(exc)[:120]})") from None
        self.format = ChatFormat.from_model_dir(model_dir)
        self.eos_id = self.tok.token_to_id(self.format.eos) if self.format.eos else None

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


@dataclass(frozen=True)
class TurnRow:
    """One finished turn, as the trace records it."""

    turn: int
    prompt_tokens: int
    output_tokens: int
    env_seconds: float
    version: int  # weights version that generated (the oldest, if it changed mid-turn)


@dataclass
class AgentTrajectory:
    """The live state of one trajectory: its context, turns and environment episode."""

    tid: str
    task_id: str
    step: int
    seed: int
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    behaviour_logprobs: list[float] = field(default_factory=list)  # per token; NaN if not generated
    token_versions: list[int] = field(default_factory=list)  # per token; -1 if not generated
    rows: list[TurnRow] = field(default_factory=list)
    pending_prompt: int = 0  # tokens appended since the last generation started
    partial: list[int] = field(default_factory=list)  # this turn's output kept so far
    partial_logprobs: list[float] = field(default_factory=list)
    partial_versions: list[int] = field(default_factory=list)
    partial_version: int = -1
    reward: float = 0.0
    done: bool = False
    truncated: bool = False
    started: bool = False  # environment reset and first prompt in the context
    wasted: int = 0  # generated tokens thrown away (restarts from zero)
    generated: int = 0  # every generated token, kept or wasted

    @property
    def group(self) -> str:
        """The GRPO group: the samples of one task drawn for one step."""
        return f"s{self.step}/{self.task_id}"

    @property
    def turns_done(self) -> int:
        return len(self.rows)

    def start(self, codec: Codec, prompt: str) -> None:
        ids = codec.encode(codec.format.first(prompt))
        self.token_ids, self.loss_mask = list(ids), [0] * len(ids)
        self.behaviour_logprobs, self.token_versions = [math.nan] * len(ids), [-1] * len(ids)
        self.pending_prompt, self.started = len(ids), True

    def context(self) -> list[int]:
        """The tokens to prefill: kept context plus this turn's partial output."""
        return self.token_ids + self.partial

    def add_output(self, ids: list[int], version: int, logprobs: list[float] | None = None,
                   versions: list[int] | None = None) -> None:
        """Generated tokens of the current turn (possibly a piece, on migration), with the
        engine's log-probability and generating version of each (absent: unknown
        log-probability, every token of ``version``)."""
        if ids:
            self.partial.extend(ids)
            self.partial_logprobs.extend(logprobs if logprobs and len(logprobs) == len(ids) else [math.nan] * len(ids))
            self.partial_versions.extend(versions if versions and len(versions) == len(ids) else [version] * len(ids))
            self.generated += len(ids)
            self.partial_version = version if self.partial_version < 0 else min(self.partial_version, version)

    def finish_turn(self, version: int) -> tuple[list[int], int]:
        """Close the current turn's generation; returns (output ids, its version)."""
        out = self.partial
        v = self.partial_version if self.partial_version >= 0 else version
        self.token_ids += out
        self.loss_mask += [1] * len(out)
        self.behaviour_logprobs += self.partial_logprobs
        self.token_versions += self.partial_versions
        self.partial, self.partial_version = [], -1
        self.partial_logprobs, self.partial_versions = [], []
        return out, v

    def record_turn(self, output: int, env_seconds: float, version: int) -> None:
        self.rows.append(TurnRow(len(self.rows), self.pending_prompt, output, env_seconds, version))
        self.pending_prompt = 0

    def add_observation(self, codec: Codec, text: str, ended_with_eos: bool, max_tokens: int) -> None:
        ids = codec.encode(codec.format.observation(text, ended_with_eos))
        if len(ids) > max_tokens:  # keep the head of long tool output, and the header
            tail = codec.encode(codec.format.after_user)
            ids = ids[: max(0, max_tokens - len(tail))] + tail
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.behaviour_logprobs += [math.nan] * len(ids)
        self.token_versions += [-1] * len(ids)
        self.pending_prompt += len(ids)

    def restart(self) -> None:
        """Interrupt without keeping progress: back to turn 0 (the env is reset again)."""
        self.wasted += sum(self.loss_mask) + len(self.partial)
        self.token_ids, self.loss_mask, self.rows = [], [], []
        self.behaviour_logprobs, self.token_versions = [], []
        self.partial, self.partial_version = [], -1
        self.partial_logprobs, self.partial_versions = [], []
        self.pending_prompt, self.started, self.done, self.truncated = 0, False, False, False
        self.reward = 0.0

    @property
    def min_version(self) -> int:
        vs = [r.version for r in self.rows]
        return min(vs) if vs else -1

    @property
    def max_version(self) -> int:
        vs = [r.version for r in self.rows]
        return max(vs) if vs else -1

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.rows)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.rows)

    def trace_rows(self) -> list[dict]:
        """Rows in the replay trace schema (DESIGN.md, Traces)."""
        reward = self.reward if math.isfinite(self.reward) else 0.0
        return [
            {
                "task_id": self.task_id, "trajectory_id": self.tid, "turn": r.turn,
                "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens,
                "env_seconds": r.env_seconds, "reward": reward, "truncated": self.truncated,
                "step": self.step, "policy_version": r.version,
            }
            for r in self.rows
        ]
