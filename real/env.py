"""The agent-environment interface the live driver rolls out against.

An environment is one episode at a time: ``reset`` starts an attempt at a task and returns
the prompt, each ``step`` runs one model turn's actions for real and reports what happened,
how long the tools took (``seconds`` is measured, never a configured delay) and, on the
last step, the reward. The driver makes one environment per concurrent trajectory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from rlsched.cluster.errors import ConfigError


@dataclass(frozen=True)
class StepResult:
    """The outcome of one agent turn: tool output, whether the episode ended, its reward
    (0.0 until the episode ends) and the measured wall-clock seconds the tools took."""

    observation: str
    done: bool
    reward: float
    seconds: float


@runtime_checkable
class Environment(Protocol):
    def task_ids(self) -> list[str]: ...

    def reset(self, task_id: str, *, seed: int) -> str: ...

    def step(self, action_text: str) -> StepResult: ...

    def close(self) -> None: ...


ENVIRONMENTS = ("coding", "lookup")


def make_environment(name: str = "coding", **kw: object) -> Environment:
    """Build a registered environment by name; ``kw`` goes to its constructor."""
    if name == "coding":
        from .env_coding import CodingEnvironment

        return CodingEnvironment(**kw)  # type: ignore[arg-type]
    if name == "lookup":
        from .env_lookup import LookupEnvironment

        return LookupEnvironment(**kw)  # type: ignore[arg-type]
    raise ConfigError(f"environment {name!r}: expected one of {', '.join(ENVIRONMENTS)}")
