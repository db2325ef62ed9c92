"""A live run in which one trajectory's agent issues every crash input of issue 26: the run
completes, nothing is lost, and that trajectory's tool failures are in the run record.

The engines, trainer, driver and the coding environment with its sandboxes are all real.
What is scripted is the *agent* of the first trajectory to start: its environment ignores
the tiny model's text and performs the hostile actions below instead (the tiny model
would not find them on its own in two steps). Every other trajectory is untouched.
"""

from __future__ import annotations

import threading

import pytest

pytestmark = pytest.mark.live

HOSTILE_TURNS = [
    # a NUL byte; a command over the argv limit; a path over NAME_MAX; a path over PATH_MAX;
    # text with lone surrogates (in the command and the path)
    "RUN: echo a\x00b\nRUN: echo " + "x" * (300 << 10) + " | wc -c\n"
    "WRITE " + "a" * 300 + "/b.py\nx = 1\nEND\nWRITE " + "d/" * 3000 + "f.py\nx\nEND\n"
    "RUN: echo \ud800\nWRITE s\udcff.py\n\ud800\nEND",
    # odd names, the grader's reserved names as directories, a tree deeper than PATH_MAX
    "RUN: touch ' ' \"$(printf 'bad\\377')\" && mkdir -p _rlsched_hidden_tests.py/x _rlsched_runner.py\n"
    "RUN: i=0; while [ $i -lt 60 ]; do mkdir " + "n" * 100 + " && cd " + "n" * 100 + " || break; i=$((i+1)); done",
    "SUBMIT",
]


class HostileAgent:
    """The real coding environment, driven by a scripted agent in the first episode to
    start anywhere (``claim``): each of its steps ignores the model's text and sends the
    next hostile turn (a stand-in for the agent only). Other episodes pass through."""

    def __init__(self, inner, claim) -> None:
        self.inner, self.claim = inner, claim
        self.hostile = False
        self.turn = 0
        self.task_id: str | None = None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def task_ids(self):
        return self.inner.task_ids()

    def reset(self, task_id, *, seed):
        self.hostile = self.hostile or self.claim(self)
        self.turn, self.task_id = 0, task_id
        return self.inner.reset(task_id, seed=seed)

    def step(self, action_text):
        if not self.hostile:
            return self.inner.step(action_text)
        text = HOSTILE_TURNS[min(self.turn, len(HOSTILE_TURNS) - 1)]
        self.turn += 1
        return self.inner.step(text)

    def close(self):
        self.inner.close()


def test_a_hostile_agent_cannot_stop_a_live_run(tiny_cache, tmp_path, monkeypatch) -> None:
    from rlsched.analysis.metrics import summarize
    from rlsched.cluster.config import RunConfig
    from rlsched.cluster.record import read_run
    from rlsched.policies import make_policy_and_spec
    from rlsched.real import run as driver
    from rlsched.real.run import run_live

    real_make_env = driver.make_env
    made: list[HostileAgent] = []
    lock = threading.Lock()

    def claim(env: HostileAgent) -> bool:
        with lock:
            if made:
                return False
            made.append(env)
            return True

    def make_env(settings):
        return HostileAgent(real_make_env(settings), claim)

    monkeypatch.setattr(driver, "make_env", make_env)
    live = {
        "tasks": ["fix-factorial", "fix-clamp"], "tasks_per_step": 2, "samples_per_task": 2, "max_turns": 3,
        "max_tokens_per_turn": 32, "kv_cache_mb": 64, "tool_seconds": 10.0, "max_wall_s": 600.0,
        "cache_dir": str(tiny_cache),
    }
    out = run_live("colocated", make=make_policy_and_spec, steps=1, out_dir=tmp_path / "run",
                   config={"run": RunConfig(gpus=2, tp=1, steps=1), "live": live}, seed=0)
    rec = read_run(out)
    assert rec.meta["complete"]
    assert summarize(rec)["lost_trajectories"] == 0
    assert made and made[0].turn >= 2, "the hostile agent never acted"
    events = rec.events
    failures = events[events["kind"] == "ToolFailure"]
    assert len(failures) == 3, failures  # the NUL byte and the two over-long paths (the rest just run)
    assert failures["trajectory"].nunique() == 1  # only the hostile trajectory's
    details = " ".join(failures["detail"])
    assert "NUL byte" in details and "WRITE refused" in details
