"""One optimizer step's learning figures, from what the trainer lane sees: the samples it
trained and the figures each micro-batch returned (``trainer._off_policy_stats``).

Why on the lane: it is the one place that sees every micro-batch of a step in order, with
its samples (whose rewards and groups say how the policy did) and the trainer's token
figures (loss, KL to the starting policy, staleness, clipping, importance ratios). The
row it makes is merged into the step's row of ``steps.parquet`` (columns
:data:`LEARNING_COLUMNS`, after the steps table's own), which the report reads without
importing ``real/``.

Token figures are means over the step's trained tokens (micro-batch means weighted by
their trained tokens); max/min are over the step. A step that trained no token has None
(NaN in the table) for them; a step with no sample has None for the rewards too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

LEARNING_COLUMNS = [
    "reward_mean",  # mean reward of the trajectories the step trained
    "reward_group_std",  # mean over GRPO groups (task) of the rewards' population std
    "groups_varying",  # share of groups whose rewards differ (a group of equal rewards trains nothing)
    "loss",  # token-mean policy-gradient loss
    "kl_to_start",  # token-mean k3 estimate of KL(pi || pi_0), pi_0 the run's starting weights
    "token_staleness_mean",  # trainer version minus generating version, mean over trained tokens
    "token_staleness_max",
    "clip_fraction",  # share of trained tokens where PPO's clip was active
    "truncated_fraction",  # share whose behaviour weight was truncated at the cap
    "ratio_mean",  # importance ratio pi_prox / pi_behav before truncation (1 on-policy)
    "ratio_min",
    "ratio_max",
]

# micro-batch figure -> step column, for the token-weighted means
_MEANS = {
    "loss": "loss", "kl_to_start": "kl_to_start", "mean_token_staleness": "token_staleness_mean",
    "clip_fraction": "clip_fraction", "truncated_fraction": "truncated_fraction", "ratio_mean": "ratio_mean",
}


class StepLearning:
    """Accumulates one step's micro-batches; :meth:`row` closes the step and starts the next."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.rewards: dict[str, list[float]] = {}
        self.tokens = 0
        self.sums: dict[str, float] = {}
        self.weights: dict[str, int] = {}
        self.extremes: dict[str, float] = {}

    def add(self, samples: Iterable[Any], stats: dict[str, Any]) -> None:
        """One micro-batch: ``samples`` (``grpo.Sample``: ``group``, ``reward``) and the
        figures the trainer returned for it."""
        for s in samples:
            if getattr(s, "reward", None) is not None:
                self.rewards.setdefault(str(s.group), []).append(float(s.reward))
        n = int(stats.get("trained_tokens", 0) or 0)
        if n <= 0:
            return
        self.tokens += n
        for src, col in _MEANS.items():
            v = stats.get(src)
            if v is not None and math.isfinite(float(v)):
                self.sums[col] = self.sums.get(col, 0.0) + float(v) * n
                self.weights[col] = self.weights.get(col, 0) + n
        for src, col, pick in (("max_token_staleness", "token_staleness_max", max),
                               ("ratio_max", "ratio_max", max), ("ratio_min", "ratio_min", min)):
            v = stats.get(src)
            if v is not None:
                self.extremes[col] = pick(self.extremes.get(col, float(v)), float(v))

    def row(self) -> dict[str, float | None]:
        out: dict[str, float | None] = dict.fromkeys(LEARNING_COLUMNS)
        out.update(reward_figures(self.rewards))
        for col, total in self.sums.items():
            out[col] = total / self.weights[col]
        out.update(self.extremes)
        self._reset()
        return out


def reward_figures(groups: dict[str, Sequence[float]]) -> dict[str, float | None]:
    """Mean reward, mean within-group population std, share of groups that vary."""
    values = [r for g in groups.values() for r in g]
    if not values:
        return {"reward_mean": None, "reward_group_std": None, "groups_varying": None}
    stds = []
    for g in groups.values():
        m = sum(g) / len(g)
        stds.append(math.sqrt(sum((r - m) ** 2 for r in g) / len(g)))
    return {
        "reward_mean": sum(values) / len(values),
        "reward_group_std": sum(stds) / len(stds),
        "groups_varying": sum(1 for g in groups.values() if max(g) != min(g)) / len(groups),
    }
