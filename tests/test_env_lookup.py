"""The learnable ``lookup`` task family: real commands in the sandbox, a checker-graded
answer file, a hidden word that only the tool reveals; and its scripted demonstrations."""

from __future__ import annotations

import random

import pytest

from rlsched.cluster.errors import ConfigError, InvariantViolation
from rlsched.real.config import LiveSettings
from rlsched.real.envs.base import Environment, make_environment
from rlsched.real.envs.lookup import (
    WORDS,
    LookupEnvironment,
    demonstrations,
    guess_command,
    hidden_word,
    parse_command,
    read_command,
)


@pytest.fixture
def env():
    e = make_environment("lookup")
    yield e
    e.close()


def test_registered_beside_coding(env) -> None:
    # made Guarded like coding: a failure of the environment ends only that episode
    assert isinstance(env, Environment) and isinstance(env.inner, LookupEnvironment)
    assert env.task_ids() == ["lookup-notes", "lookup-vault", "lookup-box", "lookup-shelf"]


def test_reading_the_file_with_the_tool_earns_the_reward(env) -> None:
    prompt = env.reset("lookup-vault", seed=7)
    assert hidden_word("lookup-vault", 7) not in prompt.split()  # only the tool reveals it
    r = env.step(f"RUN: {read_command('lookup-vault')}")
    assert r.done and r.reward == 1.0 and "correct" in r.observation and r.seconds > 0


def test_a_guess_is_right_only_when_it_is_the_hidden_word(env) -> None:
    word = hidden_word("lookup-box", 3)
    wrong = next(w for w in WORDS if w != word)
    env.reset("lookup-box", seed=3)
    assert env.step(f"RUN: {guess_command(wrong)}").reward == 0.0
    env.reset("lookup-box", seed=3)
    assert env.step(f"thinking...\nRUN: {guess_command(word)}\n").reward == 1.0


def test_the_word_is_drawn_per_episode_not_per_task() -> None:
    words = {hidden_word("lookup-notes", seed) for seed in range(200)}
    assert words == set(WORDS)
    assert hidden_word("lookup-notes", 5) == hidden_word("lookup-notes", 5)


def test_commands_run_for_real_and_the_episode_continues_until_the_answer_exists(env) -> None:
    env.reset("lookup-shelf", seed=1)
    r = env.step("RUN: ls")
    assert not r.done and "shelf.txt" in r.observation
    r = env.step("no command here")
    assert not r.done and r.observation.startswith("error:")
    r = env.step("RUN: cp vault.txt answer.txt")  # the wrong file: cp fails, no answer yet
    assert r.done and r.reward == 0.0 and "Turn limit" in r.observation and "exit 1" in r.observation
    with pytest.raises(InvariantViolation):
        env.step("RUN: ls")


def test_parse_and_errors() -> None:
    assert parse_command("x\n RUN: echo hi \nRUN: ls") == "echo hi"
    assert parse_command("RUN:") is None and parse_command("") is None
    with pytest.raises(ConfigError, match="lookup task 'nope'"):
        LookupEnvironment().reset("nope", seed=0)
    with pytest.raises(ConfigError, match="max_turns=0"):
        LookupEnvironment(max_turns=0)


def test_demonstrations_read_the_file_as_often_as_asked() -> None:
    rng = random.Random(0)
    env = LookupEnvironment()
    try:
        read = [demonstrations("lookup-box", -i - 1, rng, tool_share=1.0, env=env) for i in range(5)]
        assert all(turns[0][3] == 1.0 and "cp box.txt" in turns[0][0] for _, turns in read)
        guesses = [demonstrations("lookup-box", -i - 1, rng, tool_share=0.0, env=env) for i in range(60)]
        assert all(turns[0][0].startswith("RUN: echo ") for _, turns in guesses)
        assert sum(turns[0][3] for _, turns in guesses) < 15  # ~1 in len(WORDS)
    finally:
        env.close()


def test_warm_start_settings_are_checked() -> None:
    s = LiveSettings.from_config({"env": "lookup", "warm_start_steps": 10, "warm_start_tool_share": 0.15})
    assert s.warm_start_steps == 10 and s.warm_start_tool_share == 0.15
    with pytest.raises(ConfigError, match=r"warm_start_tool_share=1\.5"):
        LiveSettings.from_config({"warm_start_tool_share": 1.5})
    with pytest.raises(ConfigError, match="warm_start_steps=-1"):
        LiveSettings.from_config({"warm_start_steps": -1})


def test_a_warm_start_needs_an_environment_with_demonstrations(tmp_path) -> None:
    from rlsched.real.train.warm_start import warm_start

    s = LiveSettings.from_config({"env": "coding", "warm_start_steps": 10})
    with pytest.raises(ConfigError, match="environment 'coding' has no demonstrations"):
        warm_start(tmp_path, s, seed=0)


class FakeFailingSandbox:
    """A fake sandbox whose runs all hit a setup failure."""

    def __init__(self, real) -> None:
        self.real = real

    def run(self, command):
        from rlsched.cluster.errors import LiveBackendError

        raise LiveBackendError("sandbox: mount /tmp/rlsched-sbx-x: Permission denied")

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_a_lasting_sandbox_failure_ends_only_the_episode(env) -> None:
    """Through the registered (Guarded) environment the lasting failure is the episode's
    recorded tool failure, not an exception that would end the run."""
    env.reset("lookup-vault", seed=2)
    env.inner._box = failing = FakeFailingSandbox(env.inner._box)
    r = env.step("RUN: ls")
    assert r.done and r.reward == 0.0 and any("sandbox: mount" in f for f in r.tool_failures)
    failing.real.close()
