"""A trace as compact per-turn arrays, plus the run's batches.

The simulator never holds one Python object per turn: per-turn values live in NumPy
arrays and are turned into short Python lists only for trajectories in flight.

A large Parquet trace need not be loaded whole (a seed-scale trace in pandas, with its
string columns, is over a gigabyte while its per-turn arrays are under 100 MB):
:func:`trace_index` reads one row per trajectory -- all :func:`~rlsched.traces.draw_batches`
needs -- and :func:`load_workload` reads only the tasks the run's batches use, a chunk of
tasks at a time through ``load_trace(path, tasks=...)`` (which validates each chunk and
reads only the row groups that can hold it), keeping just the arrays.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rlsched.cluster.errors import TraceError


@dataclass(frozen=True)
class Workload:
    """Per-turn arrays of a trace, indexed by trajectory."""

    trajectory_ids: tuple[str, ...]
    task_ids: tuple[str, ...]
    start: np.ndarray  # first row of each trajectory
    turns: np.ndarray  # number of turns
    truncated: np.ndarray  # bool per trajectory
    prompt: np.ndarray  # per turn
    output: np.ndarray
    env: np.ndarray
    parent: tuple[str | None, ...]
    branch_turn: np.ndarray  # -1 when not branched
    index: dict[str, int]

    @classmethod
    def from_frame(cls, df: pd.DataFrame) -> Workload:
        """``df`` is a validated trace (rows grouped by trajectory, turns ascending)."""
        tid = df["trajectory_id"].to_numpy()
        n = len(tid)
        if n == 0:
            raise ValueError("empty trace")
        change = np.empty(n, dtype=bool)
        change[0] = True
        change[1:] = tid[1:] != tid[:-1]
        start = np.flatnonzero(change)
        turns = np.diff(np.append(start, n))
        ids = tuple(str(x) for x in tid[start])
        tasks = tuple(str(x) for x in df["task_id"].to_numpy()[start])
        if "truncated" in df.columns:
            tr = df["truncated"].fillna(False).to_numpy(dtype=bool)
            truncated = np.logical_or.reduceat(tr, start)
        else:
            truncated = np.zeros(len(start), dtype=bool)
        if "parent_trajectory_id" in df.columns:
            par = df["parent_trajectory_id"].to_numpy()[start]
            parent = tuple(None if (p is None or p != p or p == "") else str(p) for p in par)
            bt = df["branch_turn"].to_numpy(dtype="float64", na_value=np.nan)[start]
            branch = np.where(np.isnan(bt), -1, bt).astype(np.int64)
        else:
            parent = (None,) * len(start)
            branch = np.full(len(start), -1, dtype=np.int64)
        return cls(
            ids, tasks, start.astype(np.int64), turns.astype(np.int64), truncated,
            df["prompt_tokens"].to_numpy(dtype=np.int64),
            df["output_tokens"].to_numpy(dtype=np.int64),
            df["env_seconds"].to_numpy(dtype=np.float64),
            parent, branch, {t: i for i, t in enumerate(ids)},
        )

    @classmethod
    def concat(cls, parts: Sequence[Workload]) -> Workload:
        """One workload of several (trajectory ids must be distinct across them)."""
        if len(parts) == 1:
            return parts[0]
        ids = tuple(t for w in parts for t in w.trajectory_ids)
        index = {t: i for i, t in enumerate(ids)}
        if len(index) != len(ids):
            dup = next(t for t, n in Counter(ids).items() if n > 1)
            raise TraceError(f"trajectory {dup!r} appears in two tasks of the trace")
        offsets = np.cumsum([0] + [len(w.prompt) for w in parts[:-1]])
        return cls(
            ids, tuple(t for w in parts for t in w.task_ids),
            np.concatenate([w.start + off for w, off in zip(parts, offsets, strict=True)]),
            np.concatenate([w.turns for w in parts]),
            np.concatenate([w.truncated for w in parts]),
            np.concatenate([w.prompt for w in parts]),
            np.concatenate([w.output for w in parts]),
            np.concatenate([w.env for w in parts]),
            tuple(p for w in parts for p in w.parent),
            np.concatenate([w.branch_turn for w in parts]),
            index,
        )

    def turn_lists(self, i: int) -> tuple[list[int], list[int], list[float]]:
        s, e = int(self.start[i]), int(self.start[i] + self.turns[i])
        return self.prompt[s:e].tolist(), self.output[s:e].tolist(), self.env[s:e].tolist()


Batches = Sequence[Sequence[tuple[str, str]]]  # per step: (run trajectory id, trace trajectory id)


def simple_batches(workload: Workload, steps: int, per_step: int) -> list[list[tuple[str, str]]]:
    """Consecutive trajectories of the trace, ``per_step`` per step (tests and benches)."""
    out = []
    n = len(workload.trajectory_ids)
    for s in range(steps):
        rows = []
        for k in range(per_step):
            i = (s * per_step + k) % n
            rid = workload.trajectory_ids[i]
            lap = (s * per_step + k) // n
            rows.append((rid if lap == 0 else f"{rid}#{lap + 1}", rid))
        out.append(rows)
    return out


_INDEX_COLUMNS = ("task_id", "trajectory_id", "parent_trajectory_id", "step")


def trace_index(path: str | Path) -> pd.DataFrame:
    """The first row of each trajectory of a Parquet trace, in file order, with the columns
    :func:`~rlsched.traces.draw_batches` reads (``task_id``, ``trajectory_id`` and, when
    present, ``parent_trajectory_id`` and ``step``) plus ``rows`` (its number of turns).

    Reads only those columns, one row group at a time, keeping the first row of each run
    of equal trajectory ids, so a trace of millions of turns costs a few megabytes. The
    rows are not validated here -- :func:`load_workload` validates what it loads.
    """
    p = Path(path)
    try:
        pf = pq.ParquetFile(p)
        names = pf.schema_arrow.names
        missing = [c for c in ("task_id", "trajectory_id") if c not in names]
        if missing:
            raise TraceError(f"{p}: column {missing[0]!r} is missing — expected a trace with "
                             f"task_id and trajectory_id")
        columns = [c for c in _INDEX_COLUMNS if c in names]
        pieces: list[pd.DataFrame] = []
        for g in range(pf.metadata.num_row_groups):
            table = pf.read_row_group(g, columns=columns)
            n = table.num_rows
            if n == 0:
                continue
            tid = table.column("trajectory_id")
            change = np.ones(n, dtype=bool)
            if n > 1:
                same = pc.equal(tid.slice(1), tid.slice(0, n - 1))
                change[1:] = ~pc.fill_null(same, False).to_numpy(zero_copy_only=False)
            first = np.flatnonzero(change)
            piece = table.take(pa.array(first)).to_pandas()
            piece["rows"] = np.diff(np.append(first, n))
            pieces.append(piece)
    except TraceError:
        raise
    except (pa.ArrowException, OSError, ValueError) as err:
        raise TraceError(f"{p}: not a readable Parquet trace ({' '.join(str(err).split())[:120]})"
                         f" — expected an intact Parquet trace") from None
    if not pieces:
        raise TraceError(f"{p}: the trace has no rows — expected at least one turn")
    runs = pd.concat(pieces, ignore_index=True)
    # a trajectory split over runs (row groups, or rows not grouped): first row, all rows
    rows = runs.groupby("trajectory_id", sort=False)["rows"].sum()
    out = runs.drop_duplicates("trajectory_id").reset_index(drop=True)
    out["rows"] = rows.loc[out["trajectory_id"]].to_numpy()
    return out


def load_workload(
    path: str | Path, batches: Batches, index: pd.DataFrame | None = None,
    rows_per_chunk: int = 400_000,
) -> Workload:
    """Per-turn arrays of the trajectories ``batches`` replays (their whole tasks), read
    from a Parquet trace ``rows_per_chunk`` rows (of whole tasks) at a time.

    Each chunk is read and validated by ``load_trace(path, tasks=...)``, so errors are the
    same one-line :class:`~rlsched.cluster.errors.TraceError` naming the file; peak memory
    is one chunk in pandas plus the arrays. ``index`` is :func:`trace_index` of the file
    (read again if not given).
    """
    from rlsched.traces import load_trace

    idx = trace_index(path) if index is None else index
    task_of = dict(zip(idx["trajectory_id"].tolist(), idx["task_id"].tolist(), strict=True))
    rows_of_task: dict[str, int] = {}
    for task, n in zip(idx["task_id"].tolist(), idx["rows"].tolist(), strict=True):
        rows_of_task[task] = rows_of_task.get(task, 0) + int(n)
    needed: dict[str, None] = {}
    for batch in batches:
        for _, trace_id in batch:
            task = task_of.get(trace_id)
            if task is None:
                raise TraceError(f"{path}: trajectory {trace_id!r} is not in the trace")
            needed[task] = None
    parts: list[Workload] = []
    chunk: list[str] = []
    rows = 0
    for task in needed:
        chunk.append(task)
        rows += rows_of_task[task]
        if rows >= rows_per_chunk:
            parts.append(Workload.from_frame(load_trace(path, tasks=chunk)))
            chunk, rows = [], 0
    if chunk:
        parts.append(Workload.from_frame(load_trace(path, tasks=chunk)))
    return Workload.concat(parts)


STREAM_ROWS = 1_000_000  # Parquet traces with more turns than this are read by step


def replay_workload(
    path: str | Path, steps: int, tasks_per_step: int | None = None,
    samples_per_task: int | None = None, *, stream_rows: int = STREAM_ROWS,
) -> tuple[Workload, Batches]:
    """The per-turn arrays and the batches a replay of the trace at ``path`` needs.

    A Parquet trace of more than ``stream_rows`` turns is not loaded whole (the seed-scale
    trace in pandas peaks at ~1.7 GB; its arrays are under 100 MB): :func:`trace_index` is
    enough to draw the batches, and :func:`load_workload` reads and validates only the tasks
    they use. Smaller traces, and JSONL, are read and validated whole (``stream_rows=0``
    streams every Parquet trace)."""
    from rlsched.traces import draw_batches, load_trace
    from rlsched.traces.batches import check_draw

    if _parquet_rows(path) > stream_rows:
        index = trace_index(path)
        check_draw(index, tasks_per_step, samples_per_task, str(path))
        batches = draw_batches(index, steps, tasks_per_step, samples_per_task)
        return load_workload(path, batches, index), batches
    df = load_trace(path)
    check_draw(df, tasks_per_step, samples_per_task, str(path))
    batches = draw_batches(df, steps, tasks_per_step, samples_per_task)
    return Workload.from_frame(df), batches


def _parquet_rows(path: str | Path) -> int:
    """Rows in the file's Parquet footer; 0 when it is not readable Parquet (JSONL, or a
    broken file, which ``load_trace`` then reports in one line)."""
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (pa.ArrowException, OSError, ValueError):
        return 0
