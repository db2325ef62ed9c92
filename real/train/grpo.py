"""GRPO training samples: group-normalised advantages, computed without torch.

Each finished trajectory becomes one :class:`Sample` whose advantage is its reward
normalised within its group (the trajectories of one task): ``(r - mean) / (std + eps)``
with the population standard deviation. A group whose rewards are all equal (including a
group of one) therefore gets advantage 0 everywhere: it carries no learning signal, and
``drop_zero=True`` leaves it out instead of spending compute on it.

No reference model and no KL penalty. A trajectory that recorded its behaviour (the
engine's log-probability of each generated token and the version that generated it:
``behaviour_logprobs`` and ``token_versions``, aligned with ``token_ids``) carries them
into its sample, with each token's staleness against the trainer's ``version``, so the
loss (``pg_loss.py``) can correct for tokens an older policy generated.
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
    # Per position, aligned with token_ids (None: on-policy everywhere). The engine's
    # log-probability of each generated token (NaN elsewhere) and its staleness (trainer
    # version minus the version that generated it; 0 for non-generated positions).
    behaviour_logprobs: list[float] | None = None
    staleness: list[int] | None = None
    # The trajectory's reward (None: not known, e.g. a demonstration); for the run's
    # learning figures only, the loss reads the advantage.
    reward: float | None = None

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


def _behaviour(traj: object, index: int, version: int | None) -> tuple[list[float] | None, list[int] | None]:
    """The trajectory's behaviour log-probabilities and per-token staleness at ``version``
    (None, None when it recorded none or no trainer version is given)."""
    logprobs = getattr(traj, "behaviour_logprobs", None)
    versions = getattr(traj, "token_versions", None)
    if version is None or logprobs is None or versions is None:
        return None, None
    n = len(traj.token_ids)  # type: ignore[attr-defined]
    if len(logprobs) != n or len(versions) != n:
        raise InvariantViolation(f"grpo: trajectory {index} has {n} tokens but {len(logprobs)} behaviour "
                                 f"log-probabilities and {len(versions)} token versions")
    stale = []
    for v, m in zip(versions, traj.loss_mask, strict=True):  # type: ignore[attr-defined]
        if m and v > version:
            raise InvariantViolation(f"grpo: trajectory {index} has a token of version {v}, newer than the trainer's {version}")
        stale.append(version - v if m and v >= 0 else 0)
    return [float(x) for x in logprobs], stale


def grpo_samples(
    trajectories: Sequence[TrajectoryLike], *, eps: float = EPS, drop_zero: bool = False,
    version: int | None = None,
) -> list[Sample]:
    """One :class:`Sample` per trajectory, in input order, with group-normalised advantages;
    with the trainer's ``version``, each carries its behaviour and staleness too."""
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
        behaviour, staleness = _behaviour(traj, index, version)
        samples.append(
            Sample(
                token_ids=[int(t) for t in traj.token_ids],
                loss_mask=[int(m) for m in traj.loss_mask],
                advantage=advantage[index],
                group=_group_of(traj),
                behaviour_logprobs=behaviour,
                staleness=staleness,
                reward=float(traj.reward),
            )
        )
    return samples
