"""The agent-environment interface the live driver rolls out against.

An environment is one episode at a time: ``reset`` starts an attempt at a task and returns
the prompt, each ``step`` runs one model turn's actions for real and reports what happened,
how long the tools took (``seconds`` is measured, never a configured delay) and, on the
last step, the reward. The driver makes one environment per concurrent trajectory.

An environment's actions come from a model being optimised for reward, so nothing the
agent writes may stop the run: every agent-controlled input ends in an observation, and
:func:`make_environment` wraps each environment so that even a failure of the
environment itself (a sandbox that cannot start, a bug) ends that trajectory with a
recorded tool failure instead of an exception in the driver.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from rlsched.cluster.errors import ConfigError, InvariantViolation


@dataclass(frozen=True)
class StepResult:
    """The outcome of one agent turn: tool output, whether the episode ended, its reward
    (0.0 until the episode ends) and the measured wall-clock seconds the tools took.
    ``tool_failures`` names each action of the turn that could not be carried out (refused
    or failed in the environment), for the run record."""

    observation: str
    done: bool
    reward: float
    seconds: float
    tool_failures: tuple[str, ...] = ()


@runtime_checkable
class Environment(Protocol):
    def task_ids(self) -> list[str]: ...

    def reset(self, task_id: str, *, seed: int) -> str: ...

    def step(self, action_text: str) -> StepResult: ...

    def close(self) -> None: ...


ENVIRONMENTS = ("coding", "lookup")


def make_environment(name: str = "coding", **kw: object) -> Environment:
    """Build a registered environment by name (``kw`` goes to its constructor), wrapped in
    :class:`Guarded`."""
    if name == "coding":
        from rlsched.real.envs.coding import CodingEnvironment

        return Guarded(CodingEnvironment(**kw))  # type: ignore[arg-type]
    if name == "lookup":
        from rlsched.real.envs.lookup import LookupEnvironment

        return Guarded(LookupEnvironment(**kw))  # type: ignore[arg-type]
    raise ConfigError(f"environment {name!r}: expected one of {', '.join(ENVIRONMENTS)}")


class Guarded:
    """An environment whose failures end the episode as a recorded tool failure.

    ``reset`` that fails returns a prompt saying so and the next ``step`` ends the episode
    (reward 0); ``step`` that raises ends it the same way. Misuse by the caller (``step``
    without an open episode, an unknown task id) is still raised: that is a driver bug or a
    configuration error, not something the agent did.
    """

    def __init__(self, inner: Environment) -> None:
        self.inner = inner
        self._failed: str | None = None

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def task_ids(self) -> list[str]:
        return self.inner.task_ids()

    def reset(self, task_id: str, *, seed: int) -> str:
        self._failed = None
        try:
            return self.inner.reset(task_id, seed=seed)
        except (ConfigError, InvariantViolation):
            raise
        except Exception as err:  # the environment, not the agent: end this episode only
            self._failed = f"environment failed to start: {type(err).__name__}: {str(err)[:300]}"
            return f"Task {task_id}: {self._failed}. Reply SUBMIT.\n"

    def step(self, action_text: str) -> StepResult:
        start = time.monotonic()
        if self._failed is not None:
            why, self._failed = self._failed, None
            return StepResult(f"error: {why}", True, 0.0, time.monotonic() - start, (why,))
        try:
            return self.inner.step(action_text)
        except InvariantViolation:
            raise
        except Exception as err:
            why = f"environment failed: {type(err).__name__}: {str(err)[:300]}"
            with contextlib.suppress(Exception):
                self.inner.close()
            return StepResult(f"error: {why}", True, 0.0, time.monotonic() - start, (why,))

    def close(self) -> None:
        self.inner.close()
