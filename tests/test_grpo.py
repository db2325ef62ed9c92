"""Group-normalised advantages for GRPO samples (pure Python, no torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from rlsched.cluster.errors import InvariantViolation
from rlsched.real.train.grpo import Sample, group_advantages, grpo_samples


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


# -- behaviour and staleness into samples (pure Python) ----------------------------------


@dataclass(frozen=True)
class FakeBehaviourTrajectory:
    """A fake trajectory that recorded its behaviour, as the live agent loop does."""

    group: str
    token_ids: list[int]
    loss_mask: list[int]
    reward: float
    behaviour_logprobs: list[float]
    token_versions: list[int]


def test_samples_carry_per_token_staleness_against_the_trainer_version():
    nan = math.nan
    a = FakeBehaviourTrajectory("g", [1, 2, 3, 4], [0, 1, 0, 1], 1.0, [nan, -0.5, nan, -1.5], [-1, 3, -1, 5])
    b = FakeBehaviourTrajectory("g", [1, 2], [0, 1], 0.0, [nan, -0.1], [-1, 5])
    sa, sb = grpo_samples([a, b], version=5)
    assert sa.staleness == [0, 2, 0, 0] and sb.staleness == [0, 0]
    assert sa.behaviour_logprobs[1] == -0.5 and sa.behaviour_logprobs[3] == -1.5
    assert grpo_samples([a, b])[0].staleness is None  # no trainer version: nothing to compare to
    with pytest.raises(InvariantViolation, match="newer than the trainer"):
        grpo_samples([a], version=4)


# -- the off-policy-corrected loss (torch) -------------------------------------------------


def _logits_and_batch(torch, stale_version_gap: int = 0):
    from rlsched.real.train.pg_loss import collate, collate_behaviour

    torch.manual_seed(0)
    vocab, n = 11, 7
    ids = [[int(x) for x in torch.randint(0, vocab, (n,))] for _ in range(3)]
    masks = [[0, 0, 1, 1, 0, 1, 1], [0, 1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 0, 0]]
    advs = [1.3, -0.7, 0.4]
    # behaviour log-probs: arbitrary recorded values (what the engine reported)
    behaviour = [[math.nan if not m else -0.3 * (t + 1) for t, m in enumerate(mask)] for mask in masks]
    stale = [[stale_version_gap if m else 0 for m in mask] for mask in masks]
    samples = [Sample(i, m, a, f"g{k}", b, s) for k, (i, m, a, b, s) in enumerate(zip(ids, masks, advs, behaviour, stale, strict=True))]
    tokens, mask, adv = collate(samples)
    base = torch.randn(3, n, vocab)
    return samples, tokens, mask, adv, collate_behaviour(samples), base


def test_on_policy_samples_give_exactly_the_plain_policy_gradient():
    torch = pytest.importorskip("torch")
    from rlsched.real.train.pg_loss import off_policy_loss_sum, policy_gradient_loss_sum

    _, tokens, mask, adv, off, base = _logits_and_batch(torch, stale_version_gap=0)
    plain_logits = base.clone().requires_grad_(True)
    plain, n_plain = policy_gradient_loss_sum(plain_logits, tokens, mask, adv)
    plain.backward()
    logits = base.clone().requires_grad_(True)
    loss, n, stats = off_policy_loss_sum(logits, tokens, mask, adv, off)
    loss.backward()
    assert n == n_plain and torch.equal(loss.detach(), plain.detach())
    assert torch.equal(logits.grad, plain_logits.grad)  # bit for bit, not approximately
    assert stats["stale_tokens"] == 0 and stats["truncated_tokens"] == 0 and stats["clipped_tokens"] == 0
    assert stats["weight_sum"] == n  # every behaviour weight is exactly 1


def test_stale_tokens_are_weighted_by_their_recorded_behaviour_logprobs():
    torch = pytest.importorskip("torch")
    from rlsched.real.train.pg_loss import off_policy_loss_sum, token_logprobs

    samples, tokens, mask, adv, off, base = _logits_and_batch(torch, stale_version_gap=2)
    cap = 1e9  # no truncation: the weight must be exactly exp(log p_now - log p_behaviour)
    logits = base.clone().requires_grad_(True)
    loss, n, stats = off_policy_loss_sum(logits, tokens, mask, adv, off, behaviour_cap=cap)
    loss.backward()
    logp = token_logprobs(base, tokens)
    behaviour = torch.tensor([[0.0 if math.isnan(x) else x for x in s.behaviour_logprobs[1:]] for s in samples])
    m = mask[:, 1:]
    w = torch.exp(logp - behaviour) * m
    expect_logits = base.clone().requires_grad_(True)
    expect = -(token_logprobs(expect_logits, tokens) * m * adv.unsqueeze(1) * w).sum()
    expect.backward()
    assert torch.allclose(loss.detach(), expect.detach(), rtol=1e-6)
    assert torch.allclose(logits.grad, expect_logits.grad, rtol=1e-5, atol=1e-7)
    assert stats["stale_tokens"] == n and stats["max_staleness"] == 2 and stats["staleness_sum"] == 2 * n
    assert stats["log_ratio_sum"] == pytest.approx(float(((logp - behaviour) * m).sum()), rel=1e-5)
    # the recorded behaviour matters: other recorded values give another gradient
    shifted = [Sample(s.token_ids, s.loss_mask, s.advantage, s.group,
                      [x - 0.5 for x in s.behaviour_logprobs], s.staleness) for s in samples]
    from rlsched.real.train.pg_loss import collate_behaviour

    other = base.clone().requires_grad_(True)
    off_policy_loss_sum(other, tokens, mask, adv, collate_behaviour(shifted), behaviour_cap=cap)[0].backward()
    assert torch.allclose(other.grad, logits.grad * math.exp(0.5), rtol=1e-5, atol=1e-7)


def test_behaviour_weight_is_truncated_and_ppo_clip_acts_against_a_proximal_policy():
    torch = pytest.importorskip("torch")
    from rlsched.real.train.pg_loss import OffPolicyBatch, off_policy_loss_sum, token_logprobs

    _, tokens, mask, adv, off, base = _logits_and_batch(torch, stale_version_gap=1)
    logp = token_logprobs(base, tokens)
    very_unlikely = OffPolicyBatch(logp.detach() - 5.0, off.staleness)  # weight e^5 > cap 2
    logits = base.clone().requires_grad_(True)
    _, n, stats = off_policy_loss_sum(logits, tokens, mask, adv, very_unlikely, behaviour_cap=2.0)
    assert stats["truncated_tokens"] == n and stats["weight_sum"] == pytest.approx(2.0 * n)
    # a proximal policy the current one has moved far from: the clip zeroes those tokens' gradient
    moved = logp.detach() - 1.0  # ratio e ~ 2.7: clipped where the advantage is positive
    logits = base.clone().requires_grad_(True)
    loss, n, stats = off_policy_loss_sum(logits, tokens, mask, adv, off, proximal_logprobs=moved)
    positive = int(((adv.unsqueeze(1) > 0) & (mask[:, 1:] > 0)).sum())
    assert stats["clipped_tokens"] == positive > 0
    loss.backward()
    rows_with_positive_advantage = (adv > 0).nonzero().flatten()
    assert torch.all(logits.grad[rows_with_positive_advantage] == 0)


def test_a_stale_token_without_behaviour_logprob_is_refused():
    pytest.importorskip("torch")
    from rlsched.real.train.pg_loss import collate_behaviour

    s = Sample([1, 2, 3], [0, 1, 1], 1.0, "g", [math.nan, math.nan, -0.2], [0, 1, 1])
    with pytest.raises(InvariantViolation, match="no behaviour log-probability"):
        collate_behaviour([s])
