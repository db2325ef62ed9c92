"""The trajectory processor: one group's trajectories -> a prefix tree to train once.

Why: GRPO samples ``n`` trajectories per task, and agent frameworks retry or fork from a
turn, so a group's contexts share long prefixes (the task prompt, the turns before a fork).
Training each trajectory as its own sequence pays for the shared tokens again and again, and
at 100k-1M tokens per trajectory that dominates the training step. The processor builds a
prefix tree (a radix tree) over the group, so each shared token is trained once.

What it does (DESIGN.md "Trajectory processor"):

* **Shared prefixes**: with token ids (``TrajTokens.turn_ids``, the live driver) the tree is
  built by comparing token ids, so any common prefix is found, including the task prompt
  inside turn 0. With token counts only (the simulator, replaying a trace) a child shares
  exactly its parent's turns ``< branch_turn`` and nothing else.
* **Duplicates and subsumed paths**: a trajectory whose whole kept context equals another's
  (duplicate) or is a prefix of another's (subsumed) is merged into the first (input order)
  surviving trajectory that contains it; ``weights`` counts how many trajectories each
  survivor stands for, so no trajectory's loss is lost.
* **Partial trajectories**: ``finished_turns`` marks a timed-out / interrupted trajectory;
  only its finished turns are kept (an unfinished turn has no complete generation to train
  on). One with no finished turn is listed in ``GroupResult.empty`` -- never dropped
  silently; the policy decides to resume, train partial or drop it.

How this maps to a packed training sequence: ``GroupResult.nodes`` lists the tree's
segments in depth-first pre-order; concatenated, they are the packed sequence of length
``kept_tokens``. A token of node ``i`` attends to every token of ``i``'s ancestors and to
the tokens before it in ``i`` itself -- never to sibling branches (a tree attention mask);
its position id is ``nodes[i].offset`` plus its index in the node (positions continue along
the root path, exactly as in each trajectory's own sequence). Its loss weight is
``nodes[i].weight``: the number of original trajectories whose kept context contains it
(with per-trajectory advantages, the sum of their advantages); only generated (output)
tokens carry loss, prompt and tool tokens get weight 0 as usual. ``charged_tokens`` splits
``kept_tokens`` between survivors: each node is charged to the first survivor (input order)
through it, so a root trajectory pays its whole path and a fork pays only its own suffix --
what the simulator bills when it streams one trajectory into a micro-batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rlsched.cluster.errors import TraceError


@dataclass(frozen=True)
class TrajTokens:
    """One trajectory of a group, as the processor sees it.

    ``turn_tokens[t]``: context tokens turn ``t`` adds (prompt + output). ``parent_id`` /
    ``branch_turn``: the trajectory shares its parent's turns ``< branch_turn`` (counts
    mode). ``turn_ids``: optional token ids per turn (then sharing is found from the ids
    and ``parent_id``/``branch_turn`` are not needed). ``finished_turns``: how many leading
    turns completed (``None`` = all); the rest are dropped.
    """

    trajectory_id: str
    parent_id: str | None
    branch_turn: int | None
    turn_tokens: tuple[int, ...]
    turn_ids: tuple[tuple[int, ...], ...] | None = None
    finished_turns: int | None = None

    @property
    def kept_turns(self) -> int:
        n = len(self.turn_tokens)
        return n if self.finished_turns is None else max(0, min(n, self.finished_turns))


#: The name the design issue uses for the processor's input record.
ProcessorInput = TrajTokens


@dataclass(frozen=True)
class TreeNode:
    """One segment of the prefix tree (see the module docstring for packing)."""

    parent: int  # index into GroupResult.nodes, -1 for a child of the (empty) root
    tokens: int  # tokens in this segment
    offset: int  # tokens on the path before this segment (position id of its first token)
    weight: int  # original trajectories whose kept context contains this segment
    owner: str  # the surviving trajectory this segment is charged to


@dataclass(frozen=True)
class GroupResult:
    kept_tokens: int
    naive_tokens: int
    merged: dict[str, str] = field(default_factory=dict)
    weights: dict[str, int] = field(default_factory=dict)
    charged_tokens: dict[str, int] = field(default_factory=dict)
    nodes: tuple[TreeNode, ...] = ()
    leaf_of: dict[str, int] = field(default_factory=dict)
    empty: tuple[str, ...] = ()

    @property
    def saved_tokens(self) -> int:
        return self.naive_tokens - self.kept_tokens


class _Node:
    __slots__ = ("children", "cum", "hi", "lo", "seq")

    def __init__(self, seq: np.ndarray, cum: np.ndarray, lo: int, hi: int) -> None:
        self.seq, self.cum, self.lo, self.hi = seq, cum, lo, hi
        self.children: dict[int, _Node] = {}

    def tokens(self) -> int:
        return int(self.cum[self.hi] - self.cum[self.lo])


def _insert(root: _Node, seq: np.ndarray, cum: np.ndarray) -> _Node:
    """Add one path; return the node at whose end it stops."""
    node, pos, n = root, 0, len(seq)
    while pos < n:
        child = node.children.get(int(seq[pos]))
        if child is None:
            leaf = _Node(seq, cum, pos, n)
            node.children[int(seq[pos])] = leaf
            return leaf
        seg = child.seq[child.lo:child.hi]
        m = min(len(seg), n - pos)
        diff = np.flatnonzero(seg[:m] != seq[pos:pos + m])
        d = int(diff[0]) if diff.size else m
        if d == len(seg):
            node, pos = child, pos + d
            continue
        mid = _Node(child.seq, child.cum, child.lo, child.lo + d)  # split child at d
        child.lo += d
        mid.children[int(child.seq[child.lo])] = child
        node.children[int(seq[pos])] = mid
        if pos + d == n:
            return mid
        leaf = _Node(seq, cum, pos + d, n)
        mid.children[int(seq[pos + d])] = leaf
        return leaf
    return node


def _count_paths(trajs: Sequence[TrajTokens]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Counts mode: symbol per turn = the (trajectory, turn) that first produced it."""
    index = {t.trajectory_id: i for i, t in enumerate(trajs)}
    width = max((len(t.turn_tokens) for t in trajs), default=0) + 1
    symbols: dict[int, np.ndarray] = {}

    def resolve(i: int, seen: tuple[int, ...]) -> np.ndarray:
        if i in symbols:
            return symbols[i]
        t = trajs[i]
        own = i * width + np.arange(len(t.turn_tokens), dtype=np.int64)
        if t.parent_id is not None:
            if t.parent_id not in index:
                raise TraceError(f"trajectory {t.trajectory_id!r}: parent {t.parent_id!r} — "
                                 f"expected a trajectory of the same group")
            p = index[t.parent_id]
            if p in seen or p == i:
                chain = " -> ".join(trajs[k].trajectory_id for k in (*seen, i, p))
                raise TraceError(f"trajectory {t.trajectory_id!r}: branching cycle ({chain}) "
                                 f"— expected parents to form a tree")
            b = t.branch_turn
            parent = trajs[p]
            limit = min(len(t.turn_tokens), len(parent.turn_tokens))
            if b is None or not 0 <= b <= limit:
                raise TraceError(f"trajectory {t.trajectory_id!r}: branch_turn {b!r} — "
                                 f"expected 0..{limit} with parent {t.parent_id!r}")
            if tuple(parent.turn_tokens[:b]) != tuple(t.turn_tokens[:b]):
                raise TraceError(f"trajectory {t.trajectory_id!r}: turns before branch_turn "
                                 f"{b} differ from parent {t.parent_id!r} — expected the "
                                 f"shared turns' token counts to match")
            own[:b] = resolve(p, (*seen, i))[:b]
        symbols[i] = own
        return own

    out = []
    for i, t in enumerate(trajs):
        sym = resolve(i, ())[: t.kept_turns]
        tok = np.asarray(t.turn_tokens[: t.kept_turns], dtype=np.int64)
        if (tok < 0).any():
            raise TraceError(f"trajectory {t.trajectory_id!r}: negative turn_tokens — "
                             f"expected counts >= 0")
        cum = np.zeros(len(tok) + 1, dtype=np.int64)
        np.cumsum(tok, out=cum[1:])
        out.append((sym, cum))
    return out


def _id_paths(trajs: Sequence[TrajTokens]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Ids mode: the path is the concatenated token ids of the kept turns."""
    out = []
    for t in trajs:
        ids = t.turn_ids or ()
        if len(ids) != len(t.turn_tokens) or any(
                len(a) != n for a, n in zip(ids, t.turn_tokens, strict=True)):
            raise TraceError(f"trajectory {t.trajectory_id!r}: turn_ids do not match "
                             f"turn_tokens — expected one id per counted token, per turn")
        kept = ids[: t.kept_turns]
        seq = (np.concatenate([np.asarray(a, dtype=np.int64) for a in kept])
               if kept else np.zeros(0, dtype=np.int64))
        out.append((seq, np.arange(len(seq) + 1, dtype=np.int64)))
    return out


def process_group(trajs: Sequence[TrajTokens]) -> GroupResult:
    """Build the prefix tree of one group and say what the trainer must process.

    All trajectories must carry ``turn_ids`` or none (mixing would compare token ids with
    turn identities). Raises :class:`TraceError` for an unknown parent, a bad branch turn,
    a branching cycle, or ids that do not match the counts.
    """
    trajs = list(trajs)
    ids = {t.trajectory_id for t in trajs}
    if len(ids) != len(trajs):
        raise TraceError("process_group: a trajectory_id appears twice — expected unique ids")
    with_ids = [t.turn_ids is not None for t in trajs]
    if any(with_ids) and not all(with_ids):
        raise TraceError("process_group: some trajectories have turn_ids and some do not — "
                         "expected all or none")
    paths = _id_paths(trajs) if any(with_ids) else _count_paths(trajs)

    root = _Node(np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64), 0, 0)
    ends: list[_Node | None] = []
    naive = 0
    for seq, cum in paths:
        naive += int(cum[-1])
        ends.append(_insert(root, seq, cum) if len(seq) else None)

    empty = tuple(t.trajectory_id for t, e in zip(trajs, ends, strict=True) if e is None)
    # Survivors: the first trajectory to end at each leaf.
    survivor_at: dict[int, int] = {}
    for i, end in enumerate(ends):
        if end is not None and not end.children:
            survivor_at.setdefault(id(end), i)

    # Depth-first pre-order, children in insertion order; then weights and owners bottom-up.
    order: list[tuple[_Node, int, int]] = []  # (node, parent index, offset)
    stack = [(child, -1, 0) for child in reversed(root.children.values())]
    while stack:
        node, parent, offset = stack.pop()
        idx = len(order)
        order.append((node, parent, offset))
        stack.extend((c, idx, offset + node.tokens()) for c in reversed(node.children.values()))
    position = {id(n): k for k, (n, _, _) in enumerate(order)}
    n_nodes = len(order)
    ending_here = np.zeros(n_nodes, dtype=np.int64)
    for end in ends:
        if end is not None:
            ending_here[position[id(end)]] += 1
    weight = ending_here.copy()
    owner = np.full(n_nodes, len(trajs), dtype=np.int64)
    for k, (node, _, _) in enumerate(order):
        if id(node) in survivor_at:
            owner[k] = survivor_at[id(node)]
    for k in range(n_nodes - 1, -1, -1):  # children come after parents in pre-order
        parent = order[k][1]
        if parent >= 0:
            weight[parent] += weight[k]
            owner[parent] = min(owner[parent], owner[k])

    names = [t.trajectory_id for t in trajs]
    merged: dict[str, str] = {}
    weights: dict[str, int] = {}
    for i, end in enumerate(ends):
        if end is None:
            continue
        target = int(owner[position[id(end)]])
        if target == i:
            weights[names[i]] = weights.get(names[i], 0) + 1
        else:
            merged[names[i]] = names[target]
    for target in merged.values():
        weights[target] = weights.get(target, 0) + 1

    nodes = tuple(TreeNode(parent=p, tokens=n.tokens(), offset=off, weight=int(weight[k]),
                           owner=names[int(owner[k])])
                  for k, (n, p, off) in enumerate(order))
    charged = {names[i]: 0 for i in survivor_at.values()}
    for node in nodes:
        charged[node.owner] += node.tokens
    leaf_of = {names[i]: position[key] for key, i in survivor_at.items()}
    kept = sum(node.tokens for node in nodes)
    return GroupResult(kept_tokens=kept, naive_tokens=naive, merged=merged, weights=weights,
                       charged_tokens=charged, nodes=nodes, leaf_of=leaf_of, empty=empty)


def groups_from_trace(df: pd.DataFrame) -> dict[str, list[TrajTokens]]:
    """Per task, the processor inputs of a canonical trace (counts mode, file order).

    Every row of a trace is a finished turn (a truncated trajectory's rows stop at its last
    finished turn), so ``finished_turns`` is left ``None``.
    """
    tokens = (df["prompt_tokens"].to_numpy(dtype=np.int64)
              + df["output_tokens"].to_numpy(dtype=np.int64))
    first = np.flatnonzero(df["turn"].to_numpy() == 0)
    bounds = [*first.tolist(), len(df)]
    tasks = df["task_id"].to_numpy(dtype=object)[first]
    tids = df["trajectory_id"].to_numpy(dtype=object)[first]
    parents: Iterable = (df["parent_trajectory_id"].to_numpy(dtype=object)[first]
                         if "parent_trajectory_id" in df.columns else [None] * len(first))
    branches: Iterable = (df["branch_turn"].to_numpy(dtype=object, na_value=None)[first]
                          if "branch_turn" in df.columns else [None] * len(first))
    out: dict[str, list[TrajTokens]] = {}
    for k, (task, tid, par, bt) in enumerate(zip(tasks, tids, parents, branches, strict=True)):
        out.setdefault(task, []).append(TrajTokens(
            trajectory_id=tid, parent_id=par, branch_turn=None if bt is None else int(bt),
            turn_tokens=tuple(tokens[bounds[k]:bounds[k + 1]].tolist())))
    return out
