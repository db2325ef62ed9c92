"""Everything the report needs of a run's GPU intervals, in one pass over the file.

A seed-scale record holds ~7M interval rows per run. Loading them whole and then working
on copies (clipped spans, per-state subsets, sorted per-GPU views) made the report of a
four-policy compare take about as long as the simulations and add ~1 GB to the process's
peak. Here ``intervals.parquet`` is read one row group at a time and every figure is
accumulated as it goes:

* GPU-seconds per state: added row by row in file order (``np.add.at``), which is the
  order ``np.bincount`` adds in, so the totals equal :func:`~.intervals.seconds_by_state`
  over the whole table to the last bit (``summary.csv`` does not depend on the reader);
* the (GPU rows x time bins) grid of the plots: :class:`~.intervals.GridBuilder`, bit-equal
  to :func:`~.intervals.binned_grid`;
* tool waits inside saturated-sandbox windows (the windows come from the events first);
* the union of rollout-work time, and the ``rollout_idle`` spans (few) to overlap with it
  at the end;
* idle bubbles per GPU: drivers write a GPU's intervals as they close, so each GPU's rows
  come in time order; a gap is the distance from the GPU's previous busy interval, kept as
  (seconds, GPUs sharing it). A record whose rows are out of time order for some GPU is
  detected, and its bubbles are computed again from its busy rows alone with
  :func:`~.intervals.gap_segments` (the in-memory method).

Rows are validated as in :func:`~.load.check_record` (known states, GPU ranges inside the
cluster, ``end >= start``), with the row number counted over the whole file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rlsched.cluster.errors import RecordError
from rlsched.cluster.ids import GpuState

from .intervals import (
    STATE_INDEX,
    Grid,
    GridBuilder,
    Spans,
    gap_segments,
    overlap,
    split_ranges,
    union,
)
from .style import STATE_ORDER

COLUMNS = ("gpu_first", "gpu_count", "start", "end", "state")
EXACT_SPANS_MAX = 20_000  # keep every span when there are no more: the timeline draws them exactly
_BUSY = np.array([STATE_INDEX[GpuState.GENERATE.value], STATE_INDEX[GpuState.TRAIN.value]], dtype=np.int8)
_WORK = np.array([STATE_INDEX[GpuState.GENERATE.value], STATE_INDEX[GpuState.TOOL_WAIT.value]], dtype=np.int8)
_TOOL = STATE_INDEX[GpuState.TOOL_WAIT.value]
_RIDLE = STATE_INDEX[GpuState.ROLLOUT_IDLE.value]


@dataclass(frozen=True)
class Bubbles:
    """Idle bubbles as (seconds, GPUs) pairs and the longest one (see breakdown.bubbles)."""

    seconds: np.ndarray
    gpus: np.ndarray  # how many GPUs had a bubble of this length at this place
    longest: tuple[float, int, float] | None  # (seconds, first GPU, start): lowest GPU, then earliest


@dataclass(frozen=True)
class IntervalSummary:
    """One run's intervals, reduced to what the summary, breakdown, bubbles and plots read."""

    num_gpus: int
    horizon: float
    rows: int  # interval rows in the file
    seconds: np.ndarray  # GPU-seconds per state (STATE_ORDER) over [0, horizon]
    spans: np.ndarray  # non-empty clipped spans per state
    saturated_tool_seconds: float
    tail_idle_seconds: float
    bubbles: Bubbles | None  # None when not asked for
    grid: Grid | None  # None when not asked for
    exact: Spans | None  # every span, when there are at most EXACT_SPANS_MAX

    @property
    def grid_shape(self) -> tuple[int, int]:
        return (0, 0) if self.grid is None else (self.grid.seconds.shape[0], self.grid.seconds.shape[2])


def arrow_state_codes(states: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Index into STATE_ORDER of each row (-1: unknown or null), from a string column,
    dictionary-encoded or not; the lookup runs on the dictionary only."""
    if isinstance(states, pa.ChunkedArray):
        states = states.combine_chunks()
    if not pa.types.is_dictionary(states.type):
        states = states.dictionary_encode()
    table = np.array([STATE_INDEX.get(str(u), -1) for u in states.dictionary.to_pylist()] + [-1], dtype=np.int8)
    idx = states.indices.fill_null(len(table) - 1).to_numpy(zero_copy_only=False)
    return table[idx]


class _GapTracker:
    """Per-GPU idle gaps between busy intervals given in each GPU's time order.

    Work is per *atom*, not per GPU: a batch's row boundaries cut the GPU axis into atoms
    whose GPUs the batch's rows cover alike (an engine's GPUs, usually), so a row over 600
    trainer GPUs costs one entry per atom it covers. Only an atom's first row in a batch
    looks at its GPUs one by one (their previous busy ends may differ), at most one entry
    per GPU per batch."""

    def __init__(self, num_gpus: int) -> None:
        self.num_gpus = num_gpus
        self.last_end = np.zeros(num_gpus)
        self.last_start = np.full(num_gpus, -np.inf)
        self.seconds: list[np.ndarray] = []
        self.gpus: list[np.ndarray] = []
        self.best: tuple[float, int, float] | None = None
        self.ordered = True

    def add(self, first: np.ndarray, count: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        n = first.size
        if n == 0 or not self.ordered:
            return
        first, count = first.astype(np.int64), count.astype(np.int64)
        cut = np.zeros(self.num_gpus + 1, dtype=bool)  # the batch's range boundaries
        cut[[0, self.num_gpus]] = True
        cut[first] = True
        cut[first + count] = True
        bounds = np.flatnonzero(cut)
        piece_row, piece_atom, piece_width = split_ranges(first, count, bounds)
        o = np.argsort(piece_atom * n + piece_row)  # by atom, file (= time) order within one
        a, r = piece_atom[o], piece_row[o]
        s, e = start[r], end[r]
        p = a.size
        new = np.empty(p, dtype=bool)
        new[0] = True
        np.not_equal(a[1:], a[:-1], out=new[1:])
        if (s[1:] < s[:-1])[~new[1:]].any():
            return self._unordered()
        # an atom's first row of the batch, GPU by GPU, against each GPU's previous busy row
        fa, fr = a[new], r[new]
        lo, hi = bounds[fa], bounds[fa + 1]
        width = hi - lo
        gpu = np.repeat(lo - np.cumsum(width) + width, width) + np.arange(int(width.sum()))
        fs = np.repeat(start[fr], width)
        if (fs < self.last_start[gpu]).any():
            return self._unordered()
        prev_gpu = self.last_end[gpu]
        self._emit(gpu, np.repeat(fr, width), prev_gpu, fs - prev_gpu, np.ones(gpu.size, dtype=np.int64))
        # later rows of an atom: the gap from the atom's previous row, for all its GPUs
        prev = np.empty(p)
        prev[1:] = e[:-1]
        later = ~new
        if later.any():
            # back to piece order, where one row's atoms are neighbours and can merge
            keep = np.zeros(p, dtype=bool)
            keep[o[later]] = True
            prev_p = np.empty(p)
            prev_p[o] = prev
            sel = np.flatnonzero(keep)
            self._emit(bounds[piece_atom[sel]], piece_row[sel], prev_p[sel], start[piece_row[sel]] - prev_p[sel],
                       piece_width[sel])
        last = np.empty(p, dtype=bool)
        last[-1] = True
        last[:-1] = new[1:]
        la = a[last]
        lw = bounds[la + 1] - bounds[la]
        gl = np.repeat(bounds[la] - np.cumsum(lw) + lw, lw) + np.arange(int(lw.sum()))
        self.last_end[gl] = np.repeat(e[last], lw)
        self.last_start[gl] = np.repeat(s[last], lw)
        return None

    def _unordered(self) -> None:
        self.ordered = False
        self.seconds, self.gpus, self.best = [], [], None

    def _emit(self, gpu: np.ndarray, group: np.ndarray, lo: np.ndarray, secs: np.ndarray, width: np.ndarray) -> None:
        """Record the positive gaps (each on ``width`` GPUs from ``gpu``); neighbouring GPU
        ranges of one group with the same start become one pair."""
        keep = secs > 0
        if not keep.any():
            return
        gpu, group, lo, secs, width = gpu[keep], group[keep], lo[keep], secs[keep], width[keep]
        brk = np.empty(gpu.size, dtype=bool)
        brk[0] = True
        brk[1:] = (group[1:] != group[:-1]) | (lo[1:] != lo[:-1]) | (gpu[1:] != gpu[:-1] + width[:-1])
        at = np.flatnonzero(brk)
        sec, g0, lo0 = secs[at], gpu[at], lo[at]
        self.seconds.append(sec)
        self.gpus.append(np.add.reduceat(width, at).astype(np.int32))
        top = sec.max()
        cand = np.flatnonzero(sec == top)
        i = cand[np.lexsort((lo0[cand], g0[cand]))[0]]
        c = (float(top), int(g0[i]), float(lo0[i]))
        if self.best is None or (c[0], -c[1], -c[2]) > (self.best[0], -self.best[1], -self.best[2]):
            self.best = c

    def finish(self, horizon: float) -> Bubbles:
        """Close every GPU's last gap at ``horizon`` and return the bubbles."""
        gpu = np.arange(self.num_gpus, dtype=np.int64)
        self._emit(gpu, np.zeros(self.num_gpus, dtype=np.int64), self.last_end, horizon - self.last_end,
                   np.ones(self.num_gpus, dtype=np.int64))
        secs = np.concatenate(self.seconds) if self.seconds else np.empty(0)
        gpus = np.concatenate(self.gpus) if self.gpus else np.empty(0, dtype=np.int32)
        return Bubbles(secs, gpus, self.best)


def _bubbles_in_memory(path: Path, num_gpus: int, horizon: float) -> Bubbles:
    """Fallback for a record whose rows are out of time order: the busy rows, whole."""
    parts = []
    f = pq.ParquetFile(path, read_dictionary=["state"])
    for batch in f.iter_batches(columns=list(COLUMNS)):
        sp = _clip(batch, arrow_state_codes(batch.column("state")), horizon)
        parts.append(sp.where(np.isin(sp.state, _BUSY)))
    sp = Spans(*(np.concatenate([getattr(p, k) for p in parts]) if parts else np.empty(0) for k in
                 ("gpu_first", "gpu_count", "start", "end", "state")))
    b = gap_segments(sp, num_gpus, horizon)
    secs, w = b["seconds"].to_numpy(), b["gpu_count"].to_numpy()
    longest = None
    if secs.size:
        i = int(secs.argmax())
        longest = (float(secs[i]), int(b["gpu_first"].iat[i]), float(b["start"].iat[i]))
    return Bubbles(secs, w, longest)


def _clip(batch: pa.RecordBatch, codes: np.ndarray, horizon: float) -> Spans:
    """A batch's rows clipped to [0, horizon], empty ones dropped (as intervals.spans)."""
    col = batch.column
    start = np.clip(col("start").to_numpy(zero_copy_only=False).astype(np.float64, copy=False), 0.0, horizon)
    end = np.clip(col("end").to_numpy(zero_copy_only=False).astype(np.float64, copy=False), 0.0, horizon)
    keep = end > start
    return Spans(
        col("gpu_first").to_numpy(zero_copy_only=False).astype(np.int32, copy=False)[keep],
        col("gpu_count").to_numpy(zero_copy_only=False).astype(np.int32, copy=False)[keep],
        start[keep], end[keep], codes[keep],
    )


def _check(batch: pa.RecordBatch, codes: np.ndarray, offset: int, num_gpus: int, file: Path) -> None:
    """check_record's row checks on one batch; row numbers count from the file's start."""
    from .load import check_interval_rows

    check_interval_rows(
        file, offset, codes, lambda i: batch.column("state")[i].as_py(),
        batch.column("gpu_first").to_numpy(zero_copy_only=False),
        batch.column("gpu_count").to_numpy(zero_copy_only=False),
        batch.column("start").to_numpy(zero_copy_only=False).astype(float),
        batch.column("end").to_numpy(zero_copy_only=False).astype(float), num_gpus,
    )


def summarize_intervals(
    path: Path,
    num_gpus: int,
    horizon: float,
    *,
    sandbox: tuple[np.ndarray, np.ndarray] = (np.empty(0), np.empty(0)),
    full: bool = True,
    grid_rows: int = 128,
    grid_bins: int = 800,
    batch_rows: int | None = None,
) -> IntervalSummary:
    """Read ``path`` (a run's ``intervals.parquet``) once and reduce it (see module doc).

    ``sandbox``: the saturated-sandbox windows (disjoint, sorted) tool waits are measured
    against. ``full=False`` computes only the per-state seconds (all ``summary.csv``
    needs). ``batch_rows``: rows per read (default: the file's row groups)."""
    try:
        f = pq.ParquetFile(path, read_dictionary=["state"])
        names = set(f.schema_arrow.names)
    except Exception as exc:  # pyarrow raises many types for corrupt or foreign files
        raise RecordError(f"{path}: corrupt Parquet ({str(exc).splitlines()[0][:120]})") from None
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise RecordError(f"{path}: missing column(s) {', '.join(missing)}; not a run record this rlsched reads")
    nst = len(STATE_ORDER)
    seconds = np.zeros(nst)
    nspans = np.zeros(nst, dtype=np.int64)
    ws, we = sandbox
    saturated: list[np.ndarray] = []
    work_s, work_e = np.empty(0), np.empty(0)
    ridle: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # rollout_idle: start, end, GPUs
    exact: list[Spans] | None = []
    gaps = _GapTracker(num_gpus)
    builder = GridBuilder(num_gpus, horizon, max_rows=grid_rows, bins=grid_bins) if full else None
    rows = 0
    try:
        batches = f.iter_batches(batch_size=batch_rows or max(f.metadata.row_group(0).num_rows if f.num_row_groups else 1, 1),
                                 columns=list(COLUMNS))
        for batch in batches:
            codes = arrow_state_codes(batch.column("state"))
            _check(batch, codes, rows, num_gpus, path)
            rows += batch.num_rows
            sp = _clip(batch, codes, horizon)
            np.add.at(seconds, sp.state, sp.gpu_seconds)
            nspans += np.bincount(sp.state, minlength=nst)
            if not full:
                continue
            builder.add(sp)  # type: ignore[union-attr]
            if exact is not None:
                exact.append(sp)
                if sum(p.start.size for p in exact) > EXACT_SPANS_MAX:
                    exact = None
            # (each part gathers only the columns it reads: these are millions of rows)
            if ws.size:
                m = sp.state == _TOOL
                saturated.append(overlap(sp.start[m], sp.end[m], ws, we) * sp.gpu_count[m])
            m = (sp.state == _WORK[0]) | (sp.state == _WORK[1])
            if m.any():
                cs, ce = union(sp.start[m], sp.end[m])
                work_s, work_e = union(np.concatenate([work_s, cs]), np.concatenate([work_e, ce]))
            m = sp.state == _RIDLE
            if m.any():
                ridle.append((sp.start[m], sp.end[m], sp.gpu_count[m]))
            m = (sp.state == _BUSY[0]) | (sp.state == _BUSY[1])
            gaps.add(sp.gpu_first[m], sp.gpu_count[m], sp.start[m], sp.end[m])
    except RecordError:
        raise
    except Exception as exc:
        raise RecordError(f"{path}: corrupt Parquet ({str(exc).splitlines()[0][:120]})") from None
    if not full:
        return IntervalSummary(num_gpus, horizon, rows, seconds, nspans, 0.0, 0.0, None, None, None)
    sat = float(np.concatenate(saturated).sum()) if saturated else 0.0
    tail = 0.0
    if ridle:
        r_start, r_end, r_count = (np.concatenate(c) for c in zip(*ridle, strict=True))
        tail = float((overlap(r_start, r_end, work_s, work_e) * r_count).sum())
    bubbles = gaps.finish(horizon) if gaps.ordered else _bubbles_in_memory(path, num_gpus, horizon)
    spans_all = None
    if exact is not None:
        spans_all = Spans(*(np.concatenate([getattr(p, k) for p in exact]) if exact else np.empty(0, dtype=d)
                            for k, d in (("gpu_first", np.int32), ("gpu_count", np.int32), ("start", np.float64),
                                         ("end", np.float64), ("state", np.int8))))
    return IntervalSummary(num_gpus, horizon, rows, seconds, nspans, sat, tail, bubbles,
                           builder.finish(), spans_all)  # type: ignore[union-attr]
