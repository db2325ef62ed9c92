"""The trajectory processor on hand-built trees, with token counts and with token ids."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.cluster.errors import TraceError
from rlsched.traces import generate_trace, load_trace, sample_trace_path
from rlsched.traces.processor import TrajTokens, groups_from_trace, process_group


def T(tid, tokens, parent=None, branch=None, ids=None, finished=None):
    return TrajTokens(tid, parent, branch, tuple(tokens), ids, finished)


def check_invariants(trajs, res):
    assert sum(res.charged_tokens.values()) == res.kept_tokens
    assert sum(res.weights.values()) + len(res.empty) == len(trajs)
    assert set(res.weights) == set(res.charged_tokens) == set(res.leaf_of)
    assert not set(res.merged) & set(res.weights)
    assert all(target in res.weights for target in res.merged.values())
    assert sum(n.tokens for n in res.nodes) == res.kept_tokens
    for k, node in enumerate(res.nodes):
        if node.parent >= 0:
            parent = res.nodes[node.parent]
            assert node.parent < k and node.offset == parent.offset + parent.tokens
            assert parent.weight >= node.weight


def test_no_branching_no_savings():
    trajs = [T("a", [10, 20, 30]), T("b", [10, 20, 30]), T("c", [5])]
    res = process_group(trajs)
    check_invariants(trajs, res)
    # Equal counts are not equal tokens: without ids or branching nothing is shared.
    assert res.kept_tokens == res.naive_tokens == 125
    assert res.merged == {} and res.weights == {"a": 1, "b": 1, "c": 1}
    assert res.charged_tokens == {"a": 60, "b": 60, "c": 5}


def test_shared_prefix_is_counted_once_and_fork_pays_its_suffix():
    trajs = [T("a", [10, 20, 30]), T("b", [10, 20, 5, 5], parent="a", branch=2)]
    res = process_group(trajs)
    check_invariants(trajs, res)
    assert res.naive_tokens == 100 and res.kept_tokens == 70 and res.saved_tokens == 30
    assert res.charged_tokens == {"a": 60, "b": 10}
    shared = [n for n in res.nodes if n.parent == -1]
    assert len(shared) == 1 and shared[0].tokens == 30 and shared[0].weight == 2
    assert sorted((n.tokens, n.offset, n.weight) for n in res.nodes if n.parent == 0) == [
        (10, 30, 1), (30, 30, 1)]


def test_nested_forks():
    trajs = [T("a", [1, 2, 3, 4]), T("b", [1, 2, 7, 7], parent="a", branch=2),
             T("c", [1, 2, 7, 9], parent="b", branch=3)]
    res = process_group(trajs)
    check_invariants(trajs, res)
    assert res.kept_tokens == 10 + 14 + 9 and res.naive_tokens == 10 + 17 + 19
    assert res.charged_tokens == {"a": 10, "b": 14, "c": 9}


def test_exact_duplicate_merged_with_weight_two():
    trajs = [T("a", [10, 20]), T("b", [10, 20], parent="a", branch=2)]
    res = process_group(trajs)
    check_invariants(trajs, res)
    assert res.merged == {"b": "a"} and res.weights == {"a": 2}
    assert res.kept_tokens == 30 and res.naive_tokens == 60
    assert [n.weight for n in res.nodes] == [2]


def test_subsumed_path_is_merged_into_the_longer_one():
    # c stops right at its branch point: its whole context is a prefix of a's.
    trajs = [T("a", [10, 20, 30]), T("c", [10, 20], parent="a", branch=2)]
    res = process_group(trajs)
    check_invariants(trajs, res)
    assert res.merged == {"c": "a"} and res.weights == {"a": 2}
    assert res.kept_tokens == 60
    # A parent that ends where its fork goes on is subsumed by the fork.
    trajs = [T("p", [10, 20]), T("k", [10, 20, 40], parent="p", branch=2)]
    res = process_group(trajs)
    assert res.merged == {"p": "k"} and res.weights == {"k": 2} and res.kept_tokens == 70


def test_partial_trajectory_keeps_only_finished_turns():
    trajs = [T("a", [10, 20, 30], finished=2), T("b", [7, 8], finished=0), T("c", [5, 5])]
    res = process_group(trajs)
    check_invariants(trajs, res)
    assert res.naive_tokens == 30 + 10 and res.kept_tokens == 40
    assert res.charged_tokens == {"a": 30, "c": 10}
    assert res.empty == ("b",)  # nothing finished: reported, not silently dropped
    # A fork that timed out before its branch point is subsumed by its parent.
    trajs = [T("a", [10, 20, 30]), T("b", [10, 20, 30, 40], parent="a", branch=3, finished=1)]
    res = process_group(trajs)
    assert res.merged == {"b": "a"} and res.kept_tokens == 60


def test_token_ids_find_the_shared_prompt():
    prompt = (1, 2, 3, 4)
    trajs = [T("a", [6, 2], ids=((*prompt, 9, 9), (5, 5))),
             T("b", [6, 1], ids=((*prompt, 8, 8), (5,))),
             T("c", [6, 2], ids=((*prompt, 9, 9), (5, 5)))]
    res = process_group(trajs)
    check_invariants(trajs, res)
    assert res.naive_tokens == 8 + 7 + 8
    assert res.kept_tokens == 4 + 4 + 3  # prompt once, a's and b's own tokens
    assert res.merged == {"c": "a"} and res.weights == {"a": 2, "b": 1}
    assert res.charged_tokens == {"a": 8, "b": 3}


def test_token_ids_subsumed_and_partial():
    trajs = [T("x", [3, 2], ids=((1, 2, 3), (4, 5))),
             T("y", [3, 2], ids=((1, 2, 3), (4, 6)), finished=1)]
    res = process_group(trajs)
    assert res.merged == {"y": "x"} and res.kept_tokens == 5 and res.naive_tokens == 8


@pytest.mark.parametrize(("trajs", "message"), [
    ([T("a", [1], parent="zz", branch=0)], "parent 'zz'"),
    ([T("a", [1, 2], parent="b", branch=1), T("b", [1, 2], parent="a", branch=1)],
     "branching cycle"),
    ([T("a", [1, 2]), T("b", [1], parent="a", branch=2)], "branch_turn 2"),
    ([T("a", [1, 2]), T("b", [9, 2], parent="a", branch=1)], "differ from parent"),
    ([T("a", [1], ids=((1,),)), T("b", [1])], "all or none"),
    ([T("a", [2], ids=((1,),))], "do not match"),
    ([T("a", [1]), T("a", [2])], "appears twice"),
])
def test_bad_groups_raise_trace_error(trajs, message):
    with pytest.raises(TraceError, match=message):
        process_group(trajs)


sequences = st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=8), min_size=1,
                     max_size=6)


@settings(max_examples=150, deadline=None)
@given(sequences)
def test_ids_mode_keeps_exactly_the_distinct_prefixes(seqs):
    trajs = [T(f"t{i}", [len(s)], ids=(tuple(s),)) for i, s in enumerate(seqs)]
    res = process_group(trajs)
    check_invariants(trajs, res)
    distinct = {tuple(s[:k]) for s in seqs for k in range(1, len(s) + 1)}
    assert res.kept_tokens == len(distinct)
    assert res.naive_tokens == sum(len(s) for s in seqs)
    maximal = {tuple(s) for s in seqs if s and not any(
        len(o) > len(s) and tuple(o[:len(s)]) == tuple(s) for o in seqs)}
    assert len(res.weights) == len(maximal)


def test_sample_trace_groups():
    groups = groups_from_trace(load_trace(sample_trace_path()))
    assert len(groups) == 64
    results = [process_group(g) for g in groups.values()]
    kept = sum(r.kept_tokens for r in results)
    naive = sum(r.naive_tokens for r in results)
    assert 0 < kept < naive  # the sample's forks share prefixes
    uniform = generate_trace("uniform", seed=0, tasks=4)
    for group in groups_from_trace(uniform).values():
        res = process_group(group)
        assert res.kept_tokens == res.naive_tokens
