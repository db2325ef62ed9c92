"""Group-normalised advantages for GRPO samples (pure Python, no torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from rlsched.cluster.errors import InvariantViolation
from rlsched.real.grpo import Sample, group_advantages, grpo_samples


@dataclass(frozen=True)
class FakeTrajectory:
    """A fake of the live driver's trajectory: only the fields grpo_samples reads."""

    group: str
    token_ids: list[int]
    loss_mask: list[int]
    reward: float


def _traj(group: str, reward: float, n: int = 3) -> FakeTrajectory:
    return FakeTrajectory(group, list(range(n)), [0] + [1] * (n - 1), reward)


def test_advantages_are_normalised_per_group():
    trajs = [_traj("a", 1.0), _traj("b", 0.5), _traj("a", 0.0), _traj("a", 0.5), _traj("b", 0.5)]
    samples = grpo_samples(trajs)
    assert [s.group for s in samples] == ["a", "b", "a", "a", "b"]
    a = [samples[i].advantage for i in (0, 2, 3)]
    std = math.sqrt((0.25 + 0.25 + 0) / 3)
    assert a == pytest.approx([0.5 / std, -0.5 / std, 0.0], rel=1e-5)
    assert sum(a) == pytest.approx(0.0, abs=1e-9)
    assert samples[1].advantage == 0.0 and samples[4].advantage == 0.0
    assert samples[0].token_ids == [0, 1, 2] and samples[0].loss_mask == [0, 1, 1]
    assert isinstance(samples[0], Sample) and samples[0].trained_tokens == 2


def test_equal_rewards_give_exactly_zero_and_can_be_dropped():
    assert group_advantages([0.1, 0.1, 0.1]) == [0.0, 0.0, 0.0]
    assert group_advantages([2 / 3]) == [0.0]
    assert group_advantages([]) == []
    trajs = [_traj("a", 1.0), _traj("a", 0.0), _traj("b", 0.3), _traj("b", 0.3)]
    kept = grpo_samples(trajs, drop_zero=True)
    assert [s.group for s in kept] == ["a", "a"]
    assert kept[0].advantage == pytest.approx(1.0, rel=1e-5)


def test_task_id_stands_in_for_group():
    @dataclass(frozen=True)
    class FakeLiveTrajectory:
        task_id: str
        token_ids: tuple[int, ...]
        loss_mask: tuple[int, ...]
        reward: float

    samples = grpo_samples([FakeLiveTrajectory("t", (1,), (1,), 1.0), FakeLiveTrajectory("t", (2,), (1,), 0.0)])
    assert [s.group for s in samples] == ["t", "t"]
    assert samples[0].advantage > 0 > samples[1].advantage


@pytest.mark.parametrize(
    ("traj", "message"),
    [
        (FakeTrajectory("a", [1, 2], [1], 1.0), "2 tokens but 1 loss-mask"),
        (FakeTrajectory("a", [1], [2], 1.0), "loss mask outside"),
        (FakeTrajectory("a", [1], [1], float("nan")), "reward nan"),
    ],
)
def test_bad_trajectories_are_invariant_violations(traj, message):
    with pytest.raises(InvariantViolation, match=message):
        grpo_samples([traj])
