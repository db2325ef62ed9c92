"""A multi-turn coding environment: the agent edits files and runs commands in a sandbox,
then submits; the reward is the fraction of the task's hidden tests that pass.

Action format (documented in every prompt, simple enough for a tiny model to emit). A turn
may hold several actions; they run in order, and free text between them is ignored::

    RUN: <shell command>        one line, run with /bin/sh in the work directory
    WRITE <path>                the lines up to a line reading END become the file
    <file contents>             (one pair of ``` fences around them is stripped)
    END
    SUBMIT                      run the hidden tests and end the episode

A turn with no recognisable action, a WRITE without END or a path outside the work
directory gets an error observation, never an exception. After ``max_turns`` turns the
episode ends as if the agent had submitted. Hidden tests run on a copy of the agent's
files in a fresh sandbox, with the task's test file written last so it cannot be replaced.

The environment is deterministic: ``seed`` is accepted for the interface and kept on the
episode, but no randomness depends on it.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from rlsched.cluster.errors import ConfigError, InvariantViolation

from .coding_tasks import CodingTask, load_tasks
from .env import StepResult
from .sandbox import CommandResult, Limits, PathRefused, Sandbox, safe_relpath

ACTION_HELP = (
    "Actions (one or more per turn):\n"
    "RUN: <shell command>\n"
    "WRITE <path>\n<file contents>\nEND\n"
    "SUBMIT  (runs the hidden tests and ends the episode)"
)
_RUNNER = Path(__file__).resolve().parent / "hidden_tests_runner.py"
_RUNNER_NAME = "_rlsched_runner.py"
_TESTS_NAME = "_rlsched_hidden_tests.py"


@dataclass(frozen=True)
class Run:
    command: str


@dataclass(frozen=True)
class Write:
    path: str
    content: str


@dataclass(frozen=True)
class Submit:
    pass


@dataclass(frozen=True)
class ActionError:
    message: str


Action = Run | Write | Submit | ActionError


def _strip_fences(lines: list[str]) -> list[str]:
    if len(lines) >= 2 and lines[0].strip().startswith("```") and lines[-1].strip() == "```":
        return lines[1:-1]
    return lines


def parse_actions(text: str) -> list[Action]:
    """Split one model turn into actions; anything after SUBMIT is ignored."""
    lines = text.splitlines()
    actions: list[Action] = []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if line.startswith("RUN:"):
            command = line[4:].strip()
            actions.append(Run(command) if command else ActionError("RUN: needs a command"))
        elif line == "WRITE" or line.startswith("WRITE "):
            path = line[5:].strip()
            end = next((j for j in range(i, len(lines)) if lines[j].strip() == "END"), None)
            if not path:
                actions.append(ActionError("WRITE needs a path: WRITE <path>"))
            elif end is None:
                actions.append(ActionError(f"WRITE {path}: no END line after the contents"))
                break
            else:
                body = _strip_fences(lines[i:end])
                actions.append(Write(path, "\n".join(body) + ("\n" if body else "")))
            if end is not None:
                i = end + 1
        elif line == "SUBMIT":
            actions.append(Submit())
            break
    if not actions:
        actions.append(ActionError("no action found. " + ACTION_HELP))
    return actions


@dataclass(frozen=True)
class Evaluation:
    passed: int
    total: int
    detail: str
    seconds: float

    @property
    def reward(self) -> float:
        return self.passed / self.total


class CodingEnvironment:
    """One episode at a time over the coding tasks in ``tasks_dir`` (default: shipped)."""

    def __init__(
        self,
        *,
        tasks_dir: str | Path | None = None,
        limits: Limits | None = None,
        isolation: str = "auto",
        max_turns: int = 6,
        max_output_chars: int = 1500,
        root: str | Path | None = None,
    ) -> None:
        if max_turns < 1:
            raise ConfigError(f"coding environment: max_turns={max_turns}, expected >= 1")
        self.tasks: dict[str, CodingTask] = load_tasks(tasks_dir)
        self.limits = limits or Limits()
        self.isolation = isolation
        self.max_turns = max_turns
        self.max_output_chars = max_output_chars
        self.root = root
        self._box: Sandbox | None = None
        self._task: CodingTask | None = None
        self._turns = 0
        self._done = True
        self.seed: int | None = None
        self.last_evaluation: Evaluation | None = None

    def task_ids(self) -> list[str]:
        return sorted(self.tasks)

    def reset(self, task_id: str, *, seed: int) -> str:
        if task_id not in self.tasks:
            raise ConfigError(f"coding task {task_id!r}: unknown; expected one of {self.task_ids()}")
        self.close()
        task = self.tasks[task_id]
        self._box = Sandbox(limits=self.limits, isolation=self.isolation, root=self.root)
        self._box.put_files(dict(task.files))
        self._task, self._turns, self._done, self.seed = task, 0, False, seed
        self.last_evaluation = None
        listing = "\n".join(f"--- {name} ---\n{text.rstrip()}" for name, text in task.files.items())
        return f"Task: {task.prompt}\n\nFiles:\n{listing}\n\n{ACTION_HELP}\n"

    def step(self, action_text: str) -> StepResult:
        if self._done or self._box is None or self._task is None:
            raise InvariantViolation("coding environment: step() without an open episode (reset first)")
        start = time.monotonic()
        self._turns += 1
        parts: list[str] = []
        submitted = False
        for action in parse_actions(action_text):
            if isinstance(action, Submit):
                submitted = True
                break
            parts.append(self._perform(action))
        done = submitted or self._turns >= self.max_turns
        reward = 0.0
        if done:
            if not submitted:
                parts.append(f"Turn limit ({self.max_turns}) reached; submitting.")
            evaluation = self.evaluate()
            self.last_evaluation = evaluation
            reward = evaluation.reward
            parts.append(f"Hidden tests: {evaluation.passed}/{evaluation.total} passed. {evaluation.detail}".rstrip())
            self._done = True
            self._box.close()
        return StepResult(
            observation="\n".join(parts), done=done, reward=reward, seconds=time.monotonic() - start
        )

    def _perform(self, action: Action) -> str:
        assert self._box is not None  # internal: step() checked the episode is open
        if isinstance(action, ActionError):
            return f"error: {action.message}"
        if isinstance(action, Write):
            try:
                result = self._box.write_file(action.path, action.content)
            except PathRefused as err:
                return f"error: {err}"
            if result.ok:
                return f"Wrote {safe_relpath(action.path)} ({len(action.content.encode())} bytes)"
            return f"error: WRITE {action.path} failed ({result.status()}): {self._clip(result.output)}"
        if isinstance(action, Run):
            result = self._box.run(action.command)
            return f"$ {action.command}\n{self._clip(result.output)}[{self._describe(result)}]"
        raise InvariantViolation(f"coding environment: unhandled action {action!r}")

    def evaluate(self, files: dict[str, str | bytes] | None = None) -> Evaluation:
        """Run the hidden tests on ``files`` (default: the agent's current work directory)."""
        assert self._task is not None  # internal: only called with an open episode
        task = self._task
        if files is None:
            assert self._box is not None  # internal: the episode's sandbox is open
            files = dict(self._box.read_files())
        marker = "RLSCHED-" + secrets.token_hex(8)
        with Sandbox(limits=self.limits, isolation=self.isolation, root=self.root) as box:
            box.put_files({k: v for k, v in files.items() if k not in (_RUNNER_NAME, _TESTS_NAME)})
            box.put_files({_RUNNER_NAME: _RUNNER.read_bytes(), _TESTS_NAME: task.tests})
            result = box.run(["python3", "-I", _RUNNER_NAME, _TESTS_NAME, marker])
        passed: set[str] = set()
        failures: list[str] = []
        for line in result.output.splitlines():
            if not line.startswith(marker + " "):
                continue
            kind, _, rest = line[len(marker) + 1 :].partition(" ")
            name, _, detail = rest.partition(" ")
            if kind == "pass" and name in task.test_names:
                passed.add(name)
            elif kind in ("fail", "error"):
                failures.append(f"{name}: {detail.strip()}")
        detail = f"First failure: {failures[0]}" if failures else ""
        if not result.ok and len(passed) < len(task.test_names) and not failures:
            detail = f"Tests stopped: {result.status()}"
        return Evaluation(len(passed), len(task.test_names), detail[:300], result.seconds)

    def _clip(self, text: str) -> str:
        if len(text) > self.max_output_chars:
            text = text[: self.max_output_chars] + f"\n... ({len(text) - self.max_output_chars} more chars cut)"
        return text if not text or text.endswith("\n") else text + "\n"

    @staticmethod
    def _describe(result: CommandResult) -> str:
        cut = ", output truncated" if result.truncated else ""
        return f"{result.status()}, {result.seconds:.2f}s{cut}"

    def close(self) -> None:
        if self._box is not None:
            self._box.close()
            self._box = None
        self._done = True
