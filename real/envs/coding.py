"""A multi-turn coding environment: the agent edits files and runs commands in a sandbox,
then submits; the reward is the fraction of the task's hidden tests that pass.

Action format (documented in every prompt, simple enough for a tiny model to emit). A turn
may hold several actions; they run in order, and free text between them is ignored::

    RUN: <shell command>        one line, run with /bin/sh in the work directory
    WRITE <path>                the lines up to a line reading END become the file
    <file contents>             (one pair of ``` fences around them is stripped)
    END
    SUBMIT                      run the hidden tests and end the episode

Nothing the agent writes raises: a turn with no recognisable action, a WRITE without END,
a path outside the work directory or longer than the OS allows, a command with a NUL
byte, any size or encoding of text, and whatever the agent leaves in its directory before
SUBMIT (odd names, reserved names, deep trees) end in an observation; an action that could
not be carried out is also named in ``StepResult.tool_failures``. Commands reach the shell
on its standard input, so their length and bytes cannot break the launch. After
``max_turns`` turns the episode ends as if the agent had submitted.

Grading (``grader.py``): the task files are masked in every sandbox (``hide``); SUBMIT
copies the agent's files into a fresh sandbox, adds the runner and the tests with every
expected value taken out, and decides the verdict here from the values reported back as
plain data -- the agent's code can neither read the expectations nor forge a pass.

The environment is deterministic: ``seed`` is accepted for the interface and kept on the
episode, but no randomness depends on it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rlsched.cluster.errors import ConfigError, InvariantViolation
from rlsched.real.envs.base import StepResult
from rlsched.real.envs.coding_tasks import TASKS_DIR, CodingTask, load_tasks
from rlsched.real.envs.grader import decide
from rlsched.real.envs.sandbox import (
    CommandResult,
    Limits,
    PathRefused,
    Sandbox,
    probe_guarantees,
    require_guarantees,
    safe_relpath,
)

ACTION_HELP = (
    "Actions (one or more per turn):\n"
    "RUN: <shell command>\n"
    "WRITE <path>\n<file contents>\nEND\n"
    "SUBMIT  (runs the hidden tests and ends the episode)"
)
_RUNNER = Path(__file__).resolve().parent / "hidden_tests_runner.py"
_RUNNER_NAME = "_rlsched_runner.py"
_TESTS_NAME = "_rlsched_hidden_tests.py"
_RESERVED = (_RUNNER_NAME, _TESTS_NAME)


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
    """One episode at a time over the coding tasks in ``tasks_dir`` (default: shipped).

    Refuses to start unless the sandbox's guarantees meet ``sandbox.LIVE_MINIMUM`` on this
    host; ``accept_weak_sandbox=True`` (or ``RLSCHED_ACCEPT_WEAK_SANDBOX=1``) accepts less.
    ``guarantees`` says what holds, for the run's meta.
    """

    def __init__(
        self,
        *,
        tasks_dir: str | Path | None = None,
        limits: Limits | None = None,
        isolation: str = "auto",
        max_turns: int = 6,
        max_output_chars: int = 1500,
        root: str | Path | None = None,
        accept_weak_sandbox: bool | None = None,
    ) -> None:
        if max_turns < 1:
            raise ConfigError(f"coding environment: max_turns={max_turns}, expected >= 1")
        self.tasks: dict[str, CodingTask] = load_tasks(tasks_dir)
        self.hide = (str(Path(tasks_dir) if tasks_dir is not None else TASKS_DIR),)
        self.guarantees = probe_guarantees(str(root) if root is not None else None, isolation)
        require_guarantees(self.guarantees, accept_weak=accept_weak_sandbox)
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
        self._box = Sandbox(limits=self.limits, isolation=self.isolation, root=self.root, hide=self.hide)
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
        failures: list[str] = []
        submitted = False
        for action in parse_actions(action_text):
            if isinstance(action, Submit):
                submitted = True
                break
            text, failure = self._perform(action)
            parts.append(text)
            if failure is not None:
                failures.append(failure)
        done = submitted or self._turns >= self.max_turns
        reward = 0.0
        if done:
            if not submitted:
                parts.append(f"Turn limit ({self.max_turns}) reached; submitting.")
            try:
                evaluation = self.evaluate()
            except Exception as err:  # the grader's sandbox failed: no reward, recorded
                why = f"grading failed: {type(err).__name__}: {str(err)[:300]}"
                failures.append(why)
                evaluation = Evaluation(0, len(self._task.test_names), why, time.monotonic() - start)
            self.last_evaluation = evaluation
            reward = evaluation.reward
            parts.append(f"Hidden tests: {evaluation.passed}/{evaluation.total} passed. {evaluation.detail}".rstrip())
            self._done = True
            try:
                self._box.close()
            except Exception as err:  # a sweep that could not empty the sandbox: recorded
                failures.append(f"closing the sandbox failed: {type(err).__name__}: {str(err)[:300]}")
        return StepResult(
            observation=_printable("\n".join(parts)),
            done=done,
            reward=reward,
            seconds=time.monotonic() - start,
            tool_failures=tuple(_printable(f) for f in failures),
        )

    def _perform(self, action: Action) -> tuple[str, str | None]:
        """Carry out one action: its observation, and why it failed if it could not be done."""
        assert self._box is not None  # internal: step() checked the episode is open
        if isinstance(action, ActionError):
            return f"error: {action.message}", None
        try:
            if isinstance(action, Write):
                try:
                    rel = safe_relpath(action.path)
                    result = self._box.write_file(rel, action.content)
                except PathRefused as err:
                    return f"error: {err}", f"WRITE refused: {err}"
                if result.ok:
                    return f"Wrote {rel} ({len(action.content.encode('utf-8', 'surrogatepass'))} bytes)", None
                why = f"WRITE {action.path[:80]} failed ({result.status()})"
                return f"error: {why}: {self._clip(result.output)}", why
            if isinstance(action, Run):
                head = f"$ {_shorten(action.command)}\n"
                if "\x00" in action.command:
                    return head + "error: the command contains a NUL byte (refused)", "RUN refused: NUL byte"
                result = self._box.run(action.command)
                return f"{head}{self._clip(result.output)}[{self._describe(result)}]", None
        except Exception as err:  # the sandbox itself failed: this action only
            why = f"{type(action).__name__} failed in the environment: {type(err).__name__}: {str(err)[:300]}"
            return f"error: {why}", why
        raise InvariantViolation(f"coding environment: unhandled action {action!r}")

    def evaluate(self, files: dict[str, str | bytes] | None = None) -> Evaluation:
        """Run the hidden tests on ``files`` (default: a copy of the agent's work directory).

        The grading sandbox is fresh and masks the task files; it gets the agent's files
        (those the OS can name and that do not collide with the grader's two reserved names;
        the rest are listed in the detail), then the runner and the tests without their
        expected values. The verdict is decided here from the reported values.
        """
        assert self._task is not None  # internal: only called with an open episode
        task = self._task
        skipped: list[str] = []
        if files is None:
            assert self._box is not None  # internal: the episode's sandbox is open
            files = dict(self._box.read_files(skipped=skipped))
        with Sandbox(limits=self.limits, isolation=self.isolation, root=self.root, hide=self.hide) as box:
            for path, content in files.items():
                if path.split("/", 1)[0] in _RESERVED:
                    skipped.append(f"{path[:80]}: reserved for the grader")
                    continue
                try:
                    box.put_files({path: content})
                except (PathRefused, OSError) as err:
                    skipped.append(f"{path[:80]}: {err}")
            box.put_files({_RUNNER_NAME: _RUNNER.read_bytes(), _TESTS_NAME: task.plan.source})
            result = box.run(["python3", "-I", _RUNNER_NAME, _TESTS_NAME])
        verdict = decide(task.plan, result.output)
        detail = f"First failure: {verdict.failures[0]}" if verdict.failures else ""
        if verdict.failures and not result.ok:
            detail += f" (tests stopped: {result.status()})"
        if skipped:
            detail += f" Not copied for grading: {'; '.join(skipped[:3])}" + (" ..." if len(skipped) > 3 else "")
        return Evaluation(len(verdict.passed), len(task.test_names), detail.strip()[:400], result.seconds)

    def _clip(self, text: str) -> str:
        if len(text) > self.max_output_chars:
            text = text[: self.max_output_chars] + f"\n... ({len(text) - self.max_output_chars} more chars cut)"
        return text if not text or text.endswith("\n") else text + "\n"

    @staticmethod
    def _describe(result: CommandResult) -> str:
        cut = ", output truncated" if result.truncated else ""
        return f"{result.status()}, {result.seconds:.2f}s{cut}"

    def close(self) -> None:
        box, self._box, self._done = self._box, None, True
        if box is not None:
            box.close()


def _shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more chars)"


def _printable(text: str) -> str:
    """Text any tokenizer can encode: lone surrogates (from odd file names) become "?", NUL "\\0"."""
    return text.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\\0")
