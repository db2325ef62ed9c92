"""The live trajectory processor's packing (``real/train/prefix_tree.py``), pure Python:
a group's samples as one token trie -- every shared prefix once, each sample's tokens
found again at their nodes, each node charged to the first sample that adds it."""

from __future__ import annotations

from rlsched.real.train.prefix_tree import charged_tokens, group_order, pack


def _path(tree, s):
    return [tree.tokens[i] for i in tree.index[s]]


def test_a_shared_prefix_is_packed_once_and_every_sample_is_found_again() -> None:
    prompt = [1, 2, 3, 4]
    seqs = [[*prompt, 9, 9, 8], [*prompt, 7, 6], [*prompt, 9, 9, 8], [*prompt, 9], [5, 1, 2]]
    tree = pack(seqs)
    assert [_path(tree, s) for s in range(len(seqs))] == seqs
    # nodes: the prompt (4) + 9,9,8 (3) + 7,6 (2) + nothing (duplicate) + nothing (subsumed) + 5,1,2 (3)
    assert len(tree) == 12 and tree.charged == (7, 2, 0, 0, 3)
    assert sum(tree.charged) == len(tree)
    for node, (p, pos) in enumerate(zip(tree.parent, tree.position, strict=True)):
        assert p < node  # a parent precedes its children: the packed row is causal on every path
        assert pos == (0 if p < 0 else tree.position[p] + 1)
    for s, seq in enumerate(seqs):  # a token sits at its own position in its trajectory
        assert [tree.position[i] for i in tree.index[s]] == list(range(len(seq)))


def test_nothing_shared_packs_every_token() -> None:
    seqs = [[1, 2], [3, 4, 5], [2, 1]]
    tree = pack(seqs)
    assert len(tree) == 7 and tree.charged == (2, 3, 2)


def test_groups_are_packed_apart() -> None:
    seqs = [[1, 2, 3], [1, 2, 4], [1, 2, 3], [7]]
    groups = ["a", "a", "b", "b"]  # the same tokens in another group are not shared
    assert group_order(groups) == {"a": [0, 1], "b": [2, 3]}
    assert charged_tokens(seqs, groups) == [3, 1, 3, 1]
    assert charged_tokens(seqs, ["a"] * 4) == [3, 1, 0, 1]
