"""Cross-row checks of a trace: turns, ownership and the branching forest.

Split from :mod:`schema` (which checks each column on its own) because these checks work on
trajectory-level arrays: trajectories are numbered by first appearance with
``pandas.factorize`` and every rule becomes a comparison of whole numpy arrays, so a trace
with tens of millions of rows validates in seconds. Each check reports the first offending
row in file order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from rlsched.cluster.errors import TraceError

if TYPE_CHECKING:
    from rlsched.traces.schema import _Where


def _codes(values: pd.Series) -> np.ndarray:
    """Integer codes in order of first appearance; missing values get -1."""
    codes, _ = pd.factorize(values, use_na_sentinel=True)
    return codes.astype(np.int64)


def _min_row(rows: np.ndarray) -> int | None:
    return int(rows.min()) if rows.size else None


def check_structure(df: pd.DataFrame, where: _Where) -> np.ndarray:
    """Validate turn order, ownership and branching; return the canonical row order.

    The returned array lists original row positions: trajectories in order of first
    appearance, turns ascending within each.
    """
    traj_codes, traj_names = pd.factorize(df["trajectory_id"])
    traj = traj_codes.astype(np.int64)
    n_traj = len(traj_names)
    turn = df["turn"].to_numpy(dtype=np.int64)
    order = np.lexsort((turn, traj))
    s_traj = traj[order]
    s_turn = turn[order]

    # Duplicate (trajectory_id, turn): the later of two equal rows is the offender.
    dup = np.zeros(len(order), dtype=bool)
    dup[1:] = (s_traj[1:] == s_traj[:-1]) & (s_turn[1:] == s_turn[:-1])
    row = _min_row(order[dup])
    if row is not None:
        raise where.fail(row, "turn", int(turn[row]),
                         f"each turn once per trajectory (trajectory "
                         f"{df['trajectory_id'].iat[row]!r} already has turn {turn[row]})")

    counts = np.bincount(traj, minlength=n_traj)
    start = np.zeros(n_traj + 1, dtype=np.int64)
    np.cumsum(counts, out=start[1:])
    expected = np.arange(len(order), dtype=np.int64) - start[s_traj]
    gap = s_turn != expected
    if gap.any():
        # First gap of each trajectory, then the one that comes first in the file.
        gpos = np.flatnonzero(gap)
        _, first_of_traj = np.unique(s_traj[gpos], return_index=True)
        cand = gpos[first_of_traj]
        pick = cand[np.argmin(order[cand])]
        row = int(order[pick])
        raise where.fail(row, "turn", int(turn[row]),
                         f"turn {int(expected[pick])} (turns of trajectory "
                         f"{df['trajectory_id'].iat[row]!r} must run 0, 1, 2, ... without gaps)")

    first_row = np.unique(traj, return_index=True)[1]  # file row of each trajectory's first turn
    _check_constant(df, "task_id", traj, first_row, where,
                    "{ref!r} (trajectory {tid!r} already belongs to task {ref!r})")
    for col in ("parent_trajectory_id", "branch_turn", "step"):
        if col in df.columns:
            _check_constant(df, col, traj, first_row, where,
                            "{ref!r}, the same on every row of trajectory {tid!r}")
    if "parent_trajectory_id" in df.columns or "branch_turn" in df.columns:
        _check_branching(df, traj, traj_names, first_row, counts, start, order, where)
    return order


def _check_constant(df: pd.DataFrame, col: str, traj: np.ndarray, first_row: np.ndarray,
                    where: _Where, expected: str) -> None:
    codes = _codes(df[col])
    ref = codes[first_row][traj]
    bad = codes != ref
    row = _first_true(bad)
    if row is not None:
        ref_row = int(first_row[traj[row]])
        ref_val = df[col].iat[ref_row]
        ref_val = None if pd.isna(ref_val) else ref_val
        raise where.fail(row, col, df[col].iat[row],
                         expected.format(ref=ref_val, tid=df["trajectory_id"].iat[row]))


def _first_true(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


def _check_branching(df: pd.DataFrame, traj: np.ndarray, traj_names: pd.Index,
                     first_row: np.ndarray, counts: np.ndarray, start: np.ndarray,
                     order: np.ndarray, where: _Where) -> None:
    """Parents exist, are in the same task, branch turns fit, shared turns match, no cycles.

    A ``branch_turn`` column without a ``parent_trajectory_id`` column is checked as if
    every parent were missing: a branch point needs something to branch from.
    """
    if "parent_trajectory_id" in df.columns:
        parent_of = df["parent_trajectory_id"].to_numpy(dtype=object)[first_row]
    else:
        parent_of = np.full(len(first_row), None, dtype=object)
    has_parent = pd.notna(parent_of)
    parent = np.full(len(first_row), -1, dtype=np.int64)
    if has_parent.any():
        parent[has_parent] = pd.Index(traj_names).get_indexer(parent_of[has_parent])
    missing = has_parent & (parent < 0)
    if missing.any():
        row = int(first_row[np.flatnonzero(missing)[0]])
        raise where.fail(row, "parent_trajectory_id", parent_of[traj[row]],
                         "the trajectory_id of another trajectory in this trace")
    task = _codes(df["task_id"])[first_row]
    other_task = has_parent & (task != task[np.maximum(parent, 0)])
    if other_task.any():
        t = int(np.flatnonzero(other_task)[0])
        row = int(first_row[t])
        raise where.fail(row, "parent_trajectory_id", parent_of[t],
                         f"a trajectory of the same task {df['task_id'].iat[row]!r}")

    if "branch_turn" in df.columns:
        bt_col = df["branch_turn"]
        bt_null = bt_col.isna().to_numpy(dtype=bool)[first_row]
        bt = bt_col.to_numpy(dtype="int64", na_value=0)[first_row]
    else:
        bt_null = np.ones(len(first_row), dtype=bool)
        bt = np.zeros(len(first_row), dtype=np.int64)
    need = has_parent & bt_null
    if need.any():
        row = int(first_row[np.flatnonzero(need)[0]])
        raise where.fail(row, "branch_turn", None,
                         "the turn the trajectory branched at (required with "
                         "parent_trajectory_id)")
    stray = ~has_parent & ~bt_null
    if stray.any():
        row = int(first_row[np.flatnonzero(stray)[0]])
        raise where.fail(row, "branch_turn", int(bt[traj[row]]),
                         "no branch_turn on a trajectory without parent_trajectory_id")
    limit = np.minimum(counts, counts[np.maximum(parent, 0)])
    out_of_range = has_parent & (bt > limit)
    if out_of_range.any():
        t = int(np.flatnonzero(out_of_range)[0])
        row = int(first_row[t])
        raise where.fail(row, "branch_turn", int(bt[t]),
                         f"0..{int(limit[t])} (the child has {int(counts[t])} turns, its "
                         f"parent {parent_of[t]!r} has {int(counts[parent[t]])})")

    _check_cycles(parent, first_row, traj_names, where)
    _check_shared_turns(df, traj, parent, bt, start, order, where)


def _check_cycles(parent: np.ndarray, first_row: np.ndarray, names: pd.Index,
                  where: _Where) -> None:
    """Pointer jumping: after ceil(log2 n)+1 doublings every acyclic chain sits on a root."""
    n = len(parent)
    anc = np.where(parent < 0, np.arange(n), parent)
    is_root = parent < 0
    for _ in range(max(1, int(np.ceil(np.log2(max(n, 2))))) + 1):
        anc = anc[anc]
    looping = ~is_root[anc]
    if looping.any():
        t = int(np.flatnonzero(looping)[0])
        chain = [str(names[t])]
        cur = int(parent[t])
        while len(chain) < 6 and str(names[cur]) not in chain:
            chain.append(str(names[cur]))
            cur = int(parent[cur])
        chain.append(str(names[cur]))
        # An id with a line break (\n, \x1e, U+2028, ...) is shown escaped: one line.
        shown = " -> ".join(c if c.isprintable() else repr(c) for c in chain)
        row = int(first_row[t])
        raise where.fail(row, "parent_trajectory_id", str(names[parent[t]]),
                         f"a parent chain that ends at a trajectory without a parent "
                         f"(branching cycle: {shown})")


def _check_shared_turns(df: pd.DataFrame, traj: np.ndarray, parent: np.ndarray,
                        bt: np.ndarray, start: np.ndarray, order: np.ndarray,
                        where: _Where) -> None:
    """Turns ``< branch_turn`` of a child are its parent's: the token counts must agree."""
    turn = df["turn"].to_numpy(dtype=np.int64)
    shared = (parent[traj] >= 0) & (turn < bt[traj])
    if not shared.any():
        return
    rows = np.flatnonzero(shared)
    parent_rows = order[start[parent[traj[rows]]] + turn[rows]]
    for col in ("prompt_tokens", "output_tokens"):
        vals = df[col].to_numpy(dtype=np.int64)
        bad = vals[rows] != vals[parent_rows]
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            row, prow = int(rows[i]), int(parent_rows[i])
            raise TraceError(
                f"{where.source}: {where.label(row)}, column {col}: {int(vals[row])} — expected "
                f"{int(vals[prow])} (turn {int(turn[row])} is shared with parent "
                f"{df['trajectory_id'].iat[prow]!r}, {where.label(prow)}, because branch_turn "
                f"is {int(bt[traj[row]])})")
