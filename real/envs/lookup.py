"""A tool-use task family a model built on this machine can learn within minutes: put a
hidden word into ``answer.txt`` with sandboxed shell commands; a checker grades the file.

Why this task: the shipped coding tasks are far beyond a tiny random-weight model, so a
live run on them cannot show learning (every sample of a task gets the same reward and
GRPO's advantages are all zero). Here the word is drawn per *episode* (from the episode's
seed) and written to a file in the episode's sandbox, so no prompt reveals it and no
amount of memorising prompts helps: the only reliable way to the reward is a command that
reads the file (``cp vault.txt answer.txt``); writing a guessed word (``echo key >
answer.txt``) is right one time in ``len(WORDS)``. RL has to discover that the
reading command pays -- which is the learning the run shows. (An earlier version asked
the model to read the word and type it back; the tiny model did not learn to copy the
token within a short warm start, and the reward then only measured guessing.)

Episode, one command per turn (free text around the ``RUN:`` line is ignored)::

    RUN: <shell command>     run in the episode's sandbox (a real subprocess); the
                             observation is ``RESULT: <first line of output>``

After each command the checker looks at ``answer.txt``: once it exists the episode ends,
with reward 1.0 if its first line is the hidden word, else 0. A turn without a command
gets an error observation; after ``max_turns`` turns the episode ends with reward 0. The
sandbox is ``sandbox.Sandbox`` (public API only), one per episode.

:func:`demonstrations` writes the episodes a scripted agent plays, for the supervised warm
start (``warm_start.py``): a ``tool_share`` of them copy the file with the tool, the rest
write a uniformly guessed word. The warm-started policy therefore rarely reads the file,
and rewards vary within a GRPO group from the first step (a lucky guess, or a read) --
the signal RL amplifies.
"""

from __future__ import annotations

import random
import time

from rlsched.cluster.errors import ConfigError, InvariantViolation
from rlsched.real.envs.base import StepResult
from rlsched.real.envs.sandbox import Limits, Sandbox

# Words the tiny model's tokenizer (trained on real/data) keeps as one token after a space,
# so answering is copying one token; any words work for a real checkpoint.
WORDS = ("cat", "key", "leaf", "loop", "hash", "gap", "fork", "chain", "block", "frame",
         "clock", "cache", "array", "body", "branch", "budget", "car", "date", "deque", "dict")
# The file each task hides its word in: one task per file name.
PLACES = ("notes", "vault", "box", "shelf")
TASK_PREFIX = "lookup-"
DEMO_TOOL_SHARE = 0.15  # share of warm-start demonstrations that read the file


def task_file(task_id: str) -> str:
    return task_id[len(TASK_PREFIX):] + ".txt"


def hidden_word(task_id: str, seed: int) -> str:
    """The episode's word: a function of (task, seed) only, so a rerun is identical."""
    return random.Random(f"{task_id}/{seed}").choice(WORDS)


ANSWER_FILE = "answer.txt"


def prompt_text(task_id: str) -> str:
    name = task_file(task_id)
    return (f"Put the word in {name} into {ANSWER_FILE}: RUN: cp {name} {ANSWER_FILE} "
            f"-- or guess it: RUN: echo <word> > {ANSWER_FILE}")


def read_command(task_id: str) -> str:
    return f"cp {task_file(task_id)} {ANSWER_FILE}"


def guess_command(word: str) -> str:
    return f"echo {word} > {ANSWER_FILE}"


def parse_command(text: str) -> str | None:
    """The command of the turn's first ``RUN:`` line (None: no command)."""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("RUN:"):
            return line[len("RUN:"):].strip() or None
    return None


class LookupEnvironment:
    """One episode at a time (the live driver makes one environment per trajectory)."""

    def __init__(self, *, max_turns: int = 3, limits: Limits | None = None, isolation: str = "auto",
                 root: str | None = None) -> None:
        if max_turns < 1:
            raise ConfigError(f"lookup environment: max_turns={max_turns}, expected >= 1")
        self.max_turns = max_turns
        self.limits = limits or Limits(wall_seconds=5.0, cpu_seconds=2)
        self.isolation, self.root = isolation, root
        self._box: Sandbox | None = None
        self._word: str | None = None
        self._task: str | None = None
        self._turns = 0
        self.read_file = False  # the episode's commands read the hidden file (statistics only)

    def task_ids(self) -> list[str]:
        return [TASK_PREFIX + p for p in PLACES]

    def reset(self, task_id: str, *, seed: int) -> str:
        if task_id not in self.task_ids():
            raise ConfigError(f"lookup task {task_id!r}: unknown; expected one of {self.task_ids()}")
        self.close()
        self._word = hidden_word(task_id, seed)
        self._box = Sandbox(limits=self.limits, isolation=self.isolation, root=self.root)
        self._box.put_files({task_file(task_id): self._word + "\n"})
        self._task, self._turns, self.read_file = task_id, 0, False
        return prompt_text(task_id)

    def step(self, action_text: str) -> StepResult:
        if self._box is None or self._word is None or self._task is None:
            raise InvariantViolation("lookup environment: step() without an open episode (reset first)")
        start = time.monotonic()
        self._turns += 1
        command = parse_command(action_text)
        if command is None:
            observation = "error: no command; use RUN: <shell command>"
        else:
            self.read_file |= task_file(self._task) in command
            result = self._box.run(command)
            first = (result.output.strip().splitlines() or [""])[0][:120]
            observation = f"RESULT: {first}" if result.ok else f"RESULT: {first} [{result.status()}]"
            answer = self._answer()
            if answer is not None:
                reward = 1.0 if answer == self._word else 0.0
                self.close()
                return StepResult(f"{observation}\nchecked: {'correct' if reward else 'wrong'}", True, reward,
                                  time.monotonic() - start)
        if self._turns >= self.max_turns:
            self.close()
            return StepResult(observation + "\nTurn limit reached.", True, 0.0, time.monotonic() - start)
        return StepResult(observation, False, 0.0, time.monotonic() - start)

    def _answer(self) -> str | None:
        """The first line of ``answer.txt`` (None: the agent has not written it)."""
        assert self._box is not None  # internal: called with an open episode
        files = self._box.read_files()
        if ANSWER_FILE not in files:
            return None
        lines = files[ANSWER_FILE].decode("utf-8", "replace").strip().splitlines()
        return lines[0].strip() if lines else ""

    def close(self) -> None:
        if self._box is not None:
            self._box.close()
            self._box = None


def demonstrations(task_id: str, seed: int, rng: random.Random, *, tool_share: float = DEMO_TOOL_SHARE,
                   env: LookupEnvironment | None = None) -> tuple[str, list[tuple[str, str, bool, float]]]:
    """Play one scripted episode for real: ``(prompt, [(action, observation, done, reward)])``.

    With probability ``tool_share`` the agent copies the hidden file into the answer;
    otherwise it writes a guessed word."""
    own = env is None
    env = env or LookupEnvironment()
    try:
        prompt = env.reset(task_id, seed=seed)
        command = read_command(task_id) if rng.random() < tool_share else guess_command(rng.choice(WORDS))
        action = f"RUN: {command}"
        r = env.step(action)
        return prompt, [(action, r.observation, r.done, r.reward)]
    finally:
        if own:
            env.close()
