"""The live trajectory processor: a group's shared token prefixes trained once.

The simulator's processor (``traces/processor.py``, charged by ``sim/processing.py``)
packs each group of a micro-batch as one prefix tree, so a path several trajectories share
is trained once. Live, the trainer does exactly that with the real tokens: the samples of
one group (one task's GRPO samples, which share at least the task prompt, and any forks
or duplicates) are inserted into a token trie; the trie's nodes, each holding one token,
form one packed sequence in which a token attends to its ancestors only (a tree attention
mask) at the position it has in its own trajectory. Every linear layer then runs once per
*distinct* prefix token instead of once per sample, and each sample's logits are read back
from the packed sequence at its own tokens' nodes -- the same numbers as an unpacked
forward pass up to floating-point rounding, so the loss, and its gradient, are unchanged
(``tests/live/test_processor_live.py``). A shared node's gradient is the sum of what every
sample that reads it contributes, as the unpacked batch would give.

Sharing happens only inside one forward pass, as in the simulator's model (a prefix
trained in an earlier micro-batch has no activations left): with the processor on, the
trainer keeps a group's samples on one rank and in one forward pass.

What it does not save on this CPU stack: attention runs densely over the packed sequence
with the mask (no block-sparse kernel), so attention FLOPs grow with the square of the
packed length; the saving is in the linear layers (most of a transformer's FLOPs at these
lengths). Each shared token is *charged* to the first sample of the micro-batch (in the
order given) that reaches it, as ``charged``.

This module is pure Python, apart from :func:`tree_mask` (torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class PackedTree:
    """One group packed as a token trie, in insertion order (a parent always precedes its
    children, so the packed sequence is causal along every root-to-leaf path).

    ``tokens``/``parent``/``position``: per node, its token, its parent node (-1 for a root)
    and its depth (the position the token has in every trajectory through it);
    ``index[s][t]``: the node of sample ``s``'s ``t``-th token; ``charged[s]``: the nodes
    sample ``s`` added (the tokens it is charged for)."""

    tokens: tuple[int, ...]
    parent: tuple[int, ...]
    position: tuple[int, ...]
    index: tuple[tuple[int, ...], ...]
    charged: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.tokens)


def pack(sequences: Sequence[Sequence[int]]) -> PackedTree:
    """Pack token sequences (one group's samples) as a trie; see :class:`PackedTree`."""
    tokens: list[int] = []
    parent: list[int] = []
    position: list[int] = []
    children: list[dict[int, int]] = []
    roots: dict[int, int] = {}
    index: list[tuple[int, ...]] = []
    charged: list[int] = []
    for seq in sequences:
        path: list[int] = []
        added = 0
        level = roots
        node = -1
        for depth, tok in enumerate(seq):
            nxt = level.get(tok)
            if nxt is None:
                nxt = len(tokens)
                tokens.append(int(tok))
                parent.append(node)
                position.append(depth)
                children.append({})
                level[tok] = nxt
                added += 1
            path.append(nxt)
            node = nxt
            level = children[nxt]
        index.append(tuple(path))
        charged.append(added)
    return PackedTree(tuple(tokens), tuple(parent), tuple(position), tuple(index), tuple(charged))


def group_order(groups: Sequence[str]) -> dict[str, list[int]]:
    """Indices of each group's members, groups in order of first appearance."""
    out: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        out.setdefault(g, []).append(i)
    return out


def charged_tokens(sequences: Sequence[Sequence[int]], groups: Sequence[str]) -> list[int]:
    """Tokens each sequence is charged for when one forward pass packs every group of
    ``sequences`` as one tree (what the trainer does with the processor on)."""
    out = [0] * len(sequences)
    for members in group_order(groups).values():
        tree = pack([sequences[i] for i in members])
        for i, n in zip(members, tree.charged, strict=True):
            out[i] = n
    return out


def tree_mask(parent: Sequence[int]) -> torch.Tensor:
    """Megatron's mask convention for a packed tree, ``[1, 1, n, n]`` bool: True where
    attention is *not* allowed -- a node attends to itself and its ancestors only."""
    import torch

    n = len(parent)
    allowed = torch.zeros((n, n), dtype=torch.bool)
    for i, p in enumerate(parent):
        if p >= 0:
            allowed[i] = allowed[p]
        allowed[i, i] = True
    return (~allowed)[None, None]


def tree_logits(model: torch.nn.Module, sequences: Sequence[Sequence[int]], groups: Sequence[str],
                longest: int) -> torch.Tensor:
    """Logits ``[len(sequences), longest, vocab]`` aligned with the right-padded batch
    ``pg_loss.collate`` makes of ``sequences`` -- one packed forward pass per group, each
    sample's rows gathered from its group's tree (pad rows are zeros: masked out of every
    sum the loss takes)."""
    import torch

    from rlsched.real.train.megatron_model import gpt_logits_at

    device = next(model.parameters()).device
    rows: list[torch.Tensor | None] = [None] * len(sequences)
    for members in group_order(groups).values():
        tree = pack([sequences[i] for i in members])
        tokens = torch.tensor(tree.tokens, dtype=torch.long, device=device)[None]
        positions = torch.tensor(tree.position, dtype=torch.long, device=device)[None]
        logits = gpt_logits_at(model, tokens, positions, tree_mask(tree.parent))[0]
        for i, idx in zip(members, tree.index, strict=True):
            rows[i] = logits[torch.tensor(idx, dtype=torch.long, device=device)]
    vocab = rows[0].shape[-1]  # type: ignore[union-attr]
    out = []
    for r in rows:
        assert r is not None
        pad = longest - r.shape[0]
        out.append(torch.cat([r, r.new_zeros((pad, vocab))]) if pad else r)
    return torch.stack(out)
