"""GRPO training samples: group-normalised advantages, computed without torch.

Each finished trajectory becomes one :class:`Sample` whose advantage is its reward
normalised within its group (the trajectories of one task): ``(r - mean) / (std + eps)``
with the population standard deviation. A group whose rewards are all equal (including a
group of one) therefore gets advantage 0 everywhere: it carries no learning signal, and
``drop_zero=True`` leaves it out instead of spending compute on it.

v1 has no reference model and no KL penalty (the policy-gradient loss in
``pg_loss.py`` is the plain advantage-weighted log-likelihood of the sampled tokens).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from rlsched.cluster.errors import InvariantViolation

EPS = 1e-6


@dataclass(frozen=True)
class Sample:
    """One trajectory ready for the trainer: its full token sequence (prompt, generated
    and tool-output tokens), which positions are trained (1 = a token the policy
    generated), its advantage and its group (task id)."""

    token_ids: list[int]
    loss_mask: list[int]
    advantage: float
    group: str

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask)


class TrajectoryLike(Protocol):
    """What :func:`grpo_samples` reads from a live trajectory (``task_id`` may stand in
    for ``group``)."""

    token_ids: Sequence[int]
    loss_mask: Sequence[int]
    reward: float


def _group_of(traj: object) -> str:
    group = getattr(traj, "group", None)
    if group is None:
        group = getattr(traj, "task_id", None)
    if group is None:
        raise InvariantViolation(f"grpo: trajectory {traj!r} has neither 'group' nor 'task_id'")
    return str(group)


def group_advantages(rewards: Sequence[float], eps: float = EPS) -> list[float]:
    """``(r - mean) / (std + eps)`` over one group, population std."""
    if not rewards or max(rewards) == min(rewards):
        # Exactly zero (not ~1e-11 from rounding in the mean): no signal in this group.
        return [0.0] * len(rewards)
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    return [(r - mean) / (std + eps) for r in rewards]


def grpo_samples(
    trajectories: Sequence[TrajectoryLike], *, eps: float = EPS, drop_zero: bool = False
) -> list[Sample]:
    """One :class:`Sample` per trajectory, in input order, with group-normalised advantages."""
    by_group: dict[str, list[int]] = {}
    for index, traj in enumerate(trajectories):
        if len(traj.token_ids) != len(traj.loss_mask):
            raise InvariantViolation(
                f"grpo: trajectory {index} has {len(traj.token_ids)} tokens but "
                f"{len(traj.loss_mask)} loss-mask entries"
            )
        if any(m not in (0, 1) for m in traj.loss_mask):
            raise InvariantViolation(f"grpo: trajectory {index} has a loss mask outside {{0, 1}}")
        if not math.isfinite(traj.reward):
            raise InvariantViolation(f"grpo: trajectory {index} has reward {traj.reward}")
        by_group.setdefault(_group_of(traj), []).append(index)
    advantage = [0.0] * len(trajectories)
    for indices in by_group.values():
        values = group_advantages([trajectories[i].reward for i in indices], eps)
        for i, value in zip(indices, values, strict=True):
            advantage[i] = value
    samples = []
    for index, traj in enumerate(trajectories):
        if drop_zero and advantage[index] == 0.0:
            continue
        samples.append(
            Sample(
                token_ids=[int(t) for t in traj.token_ids],
                loss_mask=[int(m) for m in traj.loss_mask],
                advantage=advantage[index],
                group=_group_of(traj),
            )
        )
    return samples
