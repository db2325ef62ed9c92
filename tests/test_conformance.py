"""The conformance kit accepts every shipped policy and catches broken ones."""

import random

import pytest

from rlsched.cli import main
from rlsched.cluster.commands import Reassign, Train
from rlsched.cluster.events import RunStarted, TrajectoryFinished
from rlsched.cluster.ids import Role
from rlsched.conformance import check_policy
from rlsched.policies import available, make_policy


@pytest.mark.parametrize("name", sorted(available()))
def test_shipped_policies_conform(name):
    report = check_policy(lambda: make_policy(name))
    assert report.ok, str(report)


class FakeTwoRoles:
    """A broken fake: asks for the same GPUs in two roles at once."""

    name = "fake-two-roles"
    params = ()
    max_staleness = 0
    defers = False

    def reset(self, view, rng: random.Random) -> None:
        pass

    def on_event(self, event, view):
        if isinstance(event, RunStarted):
            return [Reassign((0, 1), Role.ROLLOUT), Reassign((0,), Role.TRAIN)]
        return []


class FakeTrainsEarly:
    """A broken fake: trains a trajectory before it has finished."""

    name = "fake-trains-early"
    params = ()
    max_staleness = 0
    defers = False

    def reset(self, view, rng):
        self.started = False

    def on_event(self, event, view):
        if isinstance(event, RunStarted):
            return [Reassign(tuple(range(view.num_gpus)), Role.ROLLOUT)]
        if not self.started and view.engines():
            self.started = True
            from rlsched.cluster.commands import Dispatch

            batch = view.batch(0)
            return [Dispatch(batch), Train(batch)]
        if isinstance(event, TrajectoryFinished):
            return []
        return []


@pytest.mark.parametrize("fake", [FakeTwoRoles, FakeTrainsEarly])
def test_kit_rejects_broken_policies(fake):
    report = check_policy(fake)
    assert not report.ok
    assert any("GPU 0" in p or "not finished" in p for p in report.problems), str(report)


def test_cli_policy_check_and_list(capsys):
    assert main(["policy", "check", "colocated"]) == 0
    assert "conforms" in capsys.readouterr().out
    assert main(["policy", "list"]) == 0
    assert "elastic" in capsys.readouterr().out
    assert main(["policy", "check", "nosuch"]) == 2
    assert "unknown policy 'nosuch'" in capsys.readouterr().err


def test_cli_policy_check_of_a_broken_policy_exits_1(capsys, monkeypatch):
    """(It printed "DOES NOT conform" and exited 0: the command's exit code was dropped.)"""
    from rlsched.policies import registry

    monkeypatch.setitem(registry._REGISTRY, FakeTwoRoles.name, FakeTwoRoles)
    assert main(["policy", "check", FakeTwoRoles.name]) == 1
    assert "DOES NOT conform" in capsys.readouterr().out
