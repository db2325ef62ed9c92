"""The GRPO policy-gradient loss on token log-probabilities (torch).

For each trained position ``t`` (``loss_mask[t] == 1``: a token the policy generated),
the loss is ``-advantage * log p(token_t | tokens_<t)``. It is returned as a *sum* over
tokens together with the token count, so that the trainer can normalise by the number of
trained tokens in the whole optimizer step, however the step was split into micro-batches
and data-parallel ranks (the gradient is then exactly the token-mean loss's gradient).

v1: no importance ratio, clipping, reference model or KL term -- samples are trained
on-policy or with the staleness the scheduling policy allows, and the loss says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .grpo import Sample


def collate(samples: Sequence[Sample], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``tokens`` and ``loss_mask`` ``[batch, longest]`` and ``advantages``."""
    longest = max(len(s.token_ids) for s in samples)
    tokens = torch.full((len(samples), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(samples), longest), dtype=torch.float32)
    for row, sample in enumerate(samples):
        n = len(sample.token_ids)
        tokens[row, :n] = torch.tensor(sample.token_ids, dtype=torch.long)
        mask[row, :n] = torch.tensor(sample.loss_mask, dtype=torch.float32)
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    return tokens, mask, advantages


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``log p(tokens[:, t] | tokens[:, :t])`` for t >= 1, shape ``[batch, seq - 1]`` (fp32)."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)


def policy_gradient_loss_sum(
    logits: torch.Tensor, tokens: torch.Tensor, loss_mask: torch.Tensor, advantages: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """``(sum over trained tokens of -A * log p, number of trained tokens)``."""
    logp = token_logprobs(logits, tokens)
    mask = loss_mask[:, 1:]
    loss = -(logp * mask * advantages.unsqueeze(1)).sum()
    return loss, int(mask.sum().item())
