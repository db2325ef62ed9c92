"""The shipped coding environment: real actions in a real sandbox, reward from hidden tests."""

from __future__ import annotations

import pytest

from rlsched.cluster.errors import ConfigError, InvariantViolation
from rlsched.real.envs.base import Environment, StepResult, make_environment
from rlsched.real.envs.coding import ActionError, Run, Submit, Write, parse_actions
from rlsched.real.envs.coding_tasks import load_task, load_tasks
from rlsched.real.envs.sandbox import Limits

FAST = Limits(cpu_seconds=1, wall_seconds=10, memory_bytes=512 << 20)


@pytest.fixture(scope="module")
def env():
    environment = make_environment("coding", limits=FAST, max_turns=3, accept_weak_sandbox=True)
    yield environment
    environment.close()


FIXED_LAST = "WRITE utils.py\n```python\ndef last(xs):\n    return xs[-1]\n```\nEND\nSUBMIT\n"


def test_is_an_environment_with_the_shipped_tasks(env):
    assert isinstance(env, Environment)
    assert len(env.task_ids()) >= 10
    assert env.task_ids() == sorted(env.task_ids())


def test_prompt_shows_task_files_and_action_format(env):
    prompt = env.reset("fix-last-item", seed=0)
    assert "utils.py" in prompt and "xs[len(xs)]" in prompt
    assert "RUN:" in prompt and "WRITE <path>" in prompt and "SUBMIT" in prompt


def test_correct_solution_gets_reward_one(env):
    env.reset("fix-last-item", seed=0)
    first = env.step("Let me look.\nRUN: cat utils.py")
    assert isinstance(first, StepResult)
    assert not first.done and first.reward == 0.0
    assert "xs[len(xs)]" in first.observation and "exit 0" in first.observation
    result = env.step(FIXED_LAST)
    assert result.done and result.reward == 1.0
    assert "2/2 passed" in result.observation


def test_wrong_solution_gets_reward_zero(env):
    env.reset("fix-last-item", seed=0)
    result = env.step("WRITE utils.py\ndef last(xs):\n    return None\nEND\nSUBMIT")
    assert result.done and result.reward == 0.0
    assert "0/2 passed" in result.observation


def test_tool_time_is_measured(env):
    env.reset("fix-last-item", seed=0)
    result = env.step("RUN: sleep 0.3")
    assert result.seconds >= 0.3
    env.close()


def test_malformed_action_gets_an_error_observation(env):
    env.reset("fix-factorial", seed=0)
    result = env.step("I think the bug is in the loop.")
    assert not result.done and result.observation.startswith("error: no action found")
    result = env.step("WRITE mathx.py\ndef factorial(n):\n    return 1\n")
    assert not result.done and "no END line" in result.observation


def test_write_outside_the_workdir_is_refused(env):
    env.reset("fix-factorial", seed=0)
    result = env.step("WRITE ../../evil.py\nprint('x')\nEND")
    assert "error: path '../../evil.py' refused" in result.observation
    result = env.step("WRITE /etc/evil.py\nprint('x')\nEND")
    assert "absolute path" in result.observation


def test_turn_limit_ends_the_episode_and_evaluates(env):
    env.reset("fix-clamp", seed=0)
    assert not env.step("RUN: true").done
    assert not env.step("RUN: true").done
    last = env.step("RUN: true")
    assert last.done and "Turn limit (3) reached" in last.observation
    assert 0.0 <= last.reward < 1.0
    with pytest.raises(InvariantViolation):
        env.step("SUBMIT")


def test_agent_cannot_replace_the_hidden_tests(env):
    env.reset("fix-last-item", seed=0)
    cheat = "WRITE _rlsched_hidden_tests.py\ndef test_x():\n    pass\nEND\nSUBMIT"
    assert env.step(cheat).reward == 0.0


def test_every_shipped_task_is_solvable_and_not_solved_by_its_starter(env):
    for task_id in env.task_ids():
        task = env.tasks[task_id]
        env.reset(task_id, seed=0)
        starter = env.evaluate()
        solved = env.evaluate({**task.files, **task.solution})
        assert starter.reward < 1.0, task_id
        assert solved.reward == 1.0, (task_id, solved.detail)
    env.close()


def test_parse_actions():
    text = "thinking...\nRUN: ls -la\nWRITE a.py\nx = 1\nEND\nSUBMIT\nRUN: never"
    assert parse_actions(text) == [Run("ls -la"), Write("a.py", "x = 1\n"), Submit()]
    assert parse_actions("RUN:") == [ActionError("RUN: needs a command")]
    assert isinstance(parse_actions("WRITE\nEND")[0], ActionError)
    assert parse_actions("WRITE e.txt\nEND") == [Write("e.txt", "")]


def test_unknown_environment_and_task_are_one_line_errors(env):
    with pytest.raises(ConfigError, match="expected one of coding"):
        make_environment("chess")
    with pytest.raises(ConfigError, match="unknown"):
        env.reset("no-such-task", seed=0)


def test_bad_task_files_name_file_and_field(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('id = "t"\nprompt = "p"\ntests = "def helper(): pass"\n[files]\n"a.py" = "x"\n')
    with pytest.raises(ConfigError, match=r"bad.toml: field 'tests' defines no top-level test_"):
        load_task(bad)
    bad.write_text('id = "t"\nprompt = "p"\ntests = "def test_a(): assert 1"\n[files]\n"../a.py" = "x"\n')
    with pytest.raises(ConfigError, match=r"bad.toml: files.../a.py"):
        load_task(bad)
    bad.write_text("id = ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_task(bad)
    good = 'id = "same"\nprompt = "p"\ntests = "def test_a(): assert 1"\n[files]\n"a.py" = "x"\n'
    bad.write_text(good)
    (tmp_path / "other.toml").write_text(good)
    with pytest.raises(ConfigError, match="already defined"):
        load_tasks(tmp_path)
    with pytest.raises(ConfigError, match=r"no \*\.toml task files"):
        load_tasks(tmp_path / "empty")
