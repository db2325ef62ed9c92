"""Vectorised arithmetic on the per-GPU state intervals of a run record.

A seed-scale run (1024 GPUs, 48 steps) has hundreds of thousands of interval rows, each
covering a *range* of GPUs. Everything here works on whole columns with numpy: clipping to
``[0, makespan]``, unions of time sets, overlap of intervals with such a set (through the
set's cumulative measure, one ``np.interp`` call), expansion to one row per GPU, and
binning onto a (GPU rows x time bins) grid for the plots.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .style import STATE_ORDER

STATE_INDEX = {s: i for i, s in enumerate(STATE_ORDER)}


@dataclass(frozen=True)
class Spans:
    """Interval columns as arrays, clipped to ``[0, horizon]``, empty spans removed."""

    gpu_first: np.ndarray
    gpu_count: np.ndarray
    start: np.ndarray
    end: np.ndarray
    state: np.ndarray  # index into STATE_ORDER

    @property
    def gpu_seconds(self) -> np.ndarray:
        return (self.end - self.start) * self.gpu_count

    def where(self, mask: np.ndarray | slice) -> Spans:
        return Spans(self.gpu_first[mask], self.gpu_count[mask], self.start[mask], self.end[mask], self.state[mask])

    def of_states(self, *states: str) -> Spans:
        codes = [STATE_INDEX[s] for s in states]
        return self.where(np.isin(self.state, codes))


def state_codes(states: pd.Series) -> np.ndarray:
    """Index into STATE_ORDER of each row; -1 for a state this version does not know.

    Factorises first: a record has millions of rows but only a handful of distinct states,
    so the string lookups run on the uniques only."""
    codes, uniques = pd.factorize(states, use_na_sentinel=True)
    table = np.array([STATE_INDEX.get(str(u), -1) for u in uniques] + [-1], dtype=np.int8)
    return table[codes]  # a NaN state (code -1) picks the trailing -1


_CACHE: dict[tuple[int, float], tuple[pd.DataFrame, Spans]] = {}
_CACHE_SIZE = 4
_caching = False


@contextlib.contextmanager
def cached() -> Iterator[None]:
    """Within this block, spans and grids of the same intervals are computed once.

    The report asks for one record's spans several times (summary, breakdown, bubbles,
    plots). Results are keyed by the DataFrame's identity (the frame is held in the cache,
    so its id cannot be reused meanwhile) and all dropped when the block ends, so no record
    outlives it; outside such a block nothing is cached."""
    global _caching
    outer = _caching
    _caching = True
    try:
        yield
    finally:
        _caching = outer
        if not outer:
            _CACHE.clear()
            _GRIDS.clear()


def spans(intervals: pd.DataFrame, horizon: float) -> Spans:
    """Clip the record's intervals to ``[0, horizon]`` (states must be known: load.check_record)."""
    if not _caching:
        return _spans(intervals, horizon)
    key = (id(intervals), float(horizon))
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is intervals:
        return hit[1]
    sp = _spans(intervals, horizon)
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = (intervals, sp)
    return sp


def _spans(intervals: pd.DataFrame, horizon: float) -> Spans:
    start = np.clip(intervals["start"].to_numpy(dtype=np.float64), 0.0, horizon)
    end = np.clip(intervals["end"].to_numpy(dtype=np.float64), 0.0, horizon)
    keep = end > start
    codes = state_codes(intervals["state"])
    return Spans(  # compact dtypes: a seed-scale record has millions of rows
        intervals["gpu_first"].to_numpy(dtype=np.int32)[keep],
        intervals["gpu_count"].to_numpy(dtype=np.int32)[keep],
        start[keep],
        end[keep],
        codes[keep].astype(np.int8),
    )


def seconds_by_state(sp: Spans) -> np.ndarray:
    """GPU-seconds per state, in STATE_ORDER."""
    return np.bincount(sp.state, weights=sp.gpu_seconds, minlength=len(STATE_ORDER))


def union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint, sorted intervals covering exactly the union of ``[start, end)``."""
    if start.size == 0:
        return np.empty(0), np.empty(0)
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    # a new block begins where a start lies beyond everything before it
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    return s[new], np.maximum.reduceat(e, np.flatnonzero(new))


def overlap(start: np.ndarray, end: np.ndarray, set_start: np.ndarray, set_end: np.ndarray) -> np.ndarray:
    """Length of ``[start, end) ∩ set`` for each interval; ``set`` disjoint and sorted."""
    if set_start.size == 0:
        return np.zeros_like(start, dtype=np.float64)
    # cumulative measure of the set: piecewise linear through these knots
    knots = np.empty(2 * set_start.size)
    knots[0::2], knots[1::2] = set_start, set_end
    lengths = set_end - set_start
    cum = np.empty_like(knots)
    cum[1::2] = np.cumsum(lengths)
    cum[0::2] = cum[1::2] - lengths
    return np.interp(end, knots, cum) - np.interp(start, knots, cum)


def split_ranges(first: np.ndarray, count: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut each GPU range ``[first, first+count)`` at the sorted GPU ``bounds`` (which
    include 0 and the cluster size). Returns, per piece: the range's index, the segment
    ``k`` it lies in (``[bounds[k], bounds[k+1])``) and its width in GPUs.

    Most ranges lie in one segment (an engine's GPUs), so they pass through unexpanded."""
    end = first + count
    s0, s1 = _segments_of(bounds, first, end)
    pieces = s1 - s0 + 1
    single = pieces == 1
    if single.all():
        return np.arange(first.size), s0, count
    multi = np.flatnonzero(~single)
    pm = pieces[multi]
    idx = np.repeat(multi, pm)
    seg = s0[idx] + (np.arange(idx.size) - np.repeat(np.cumsum(pm) - pm, pm))
    width = np.minimum(end[idx], bounds[seg + 1]) - np.maximum(first[idx], bounds[seg])
    one = np.flatnonzero(single)  # pieces come singles first, then the split ranges
    return np.concatenate([one, idx]), np.concatenate([s0[one], seg]), np.concatenate([count[one], width])


_LOOKUP_MAX = 1 << 20  # GPU axes up to this long map GPUs to segments by table lookup


def _segments_of(bounds: np.ndarray, first: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segment of each range's first GPU and of its last (``end - 1``). The same as two
    binary searches in ``bounds``; for a GPU axis of ordinary length, a table with one
    entry per GPU answers them by lookup, several times faster on millions of ranges."""
    lo, hi = int(bounds[0]), int(bounds[-1])
    if first.size and hi - lo <= _LOOKUP_MAX and int(first.min()) >= lo and int(end.max()) <= hi:
        axis = np.arange(lo, hi + 1)
        right = np.searchsorted(bounds, axis, side="right") - 1
        left = np.searchsorted(bounds, axis, side="left") - 1
        return right[first - lo], left[end - lo]
    return np.searchsorted(bounds, first, side="right") - 1, np.searchsorted(bounds, end, side="left") - 1


def _by_key_then_time(key: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Order by ``key`` then ``start``. Drivers write intervals as they close, so within
    one GPU they are usually in time order already: a stable sort on the key alone then
    suffices (checked), and the full two-key sort runs only when it does not."""
    order = np.argsort(key, kind="stable")
    k, s = key[order], start[order]
    if np.all((k[1:] != k[:-1]) | (s[1:] >= s[:-1])):
        return order
    return np.lexsort((start, key))


def gap_segments(sp: Spans, num_gpus: int, horizon: float) -> pd.DataFrame:
    """The complement of ``sp`` in ``[0, horizon]``, per GPU range.

    The GPU axis is cut at every range boundary of ``sp`` into segments whose GPUs share
    exactly the same intervals, so the work is per segment (an engine), not per GPU.
    ``sp``'s intervals of one GPU must not overlap. Columns: gpu_first, gpu_count (every
    GPU of the range has this gap), start, seconds; sorted by GPU then time."""
    first, count = sp.gpu_first.astype(np.int64), sp.gpu_count.astype(np.int64)
    bounds = np.unique(np.concatenate([[0, num_gpus], first, first + count]))
    idx, seg, _ = split_ranges(first, count, bounds)
    start, end = sp.start[idx], sp.end[idx]
    order = _by_key_then_time(seg, start)
    seg, start, end = seg[order], start[order], end[order]
    same = seg[1:] == seg[:-1]
    firsts = np.flatnonzero(np.concatenate([[True], ~same])) if seg.size else np.empty(0, dtype=np.int64)
    lasts = np.concatenate([firsts[1:], [seg.size]]) - 1 if seg.size else firsts
    between = np.flatnonzero(same & (start[1:] > end[:-1]))
    never = np.setdiff1d(np.arange(bounds.size - 1), seg)
    parts = (  # in time order within a segment, so a stable sort by segment finishes it
        (seg[firsts], np.zeros(firsts.size), start[firsts]),  # before a segment's first
        (seg[between + 1], end[between], start[between + 1]),  # between two intervals
        (seg[lasts], end[lasts], np.full(lasts.size, horizon)),  # after its last
        (never, np.zeros(never.size), np.full(never.size, horizon)),  # segments with none
    )
    k = np.concatenate([p[0] for p in parts]).astype(np.int64)
    lo = np.concatenate([p[1] for p in parts])
    secs = np.concatenate([p[2] - p[1] for p in parts])
    keep = secs > 0
    k, lo, secs = k[keep], lo[keep], secs[keep]
    order = np.argsort(k, kind="stable")
    k, lo, secs = k[order], lo[order], secs[order]
    return pd.DataFrame({
        "gpu_first": bounds[k], "gpu_count": bounds[k + 1] - bounds[k], "start": lo, "seconds": secs,
    })


@dataclass(frozen=True)
class Grid:
    """GPU-seconds per (row, state, time bin): the data behind timelines and area plots.

    Row ``r`` holds GPUs ``[r*gpus_per_row, (r+1)*gpus_per_row)`` (the last row may hold
    fewer: ``row_gpus``); bin ``b`` is ``[b*dt, (b+1)*dt)``.
    """

    seconds: np.ndarray  # shape (rows, states, bins)
    gpus_per_row: int
    row_gpus: np.ndarray  # GPUs in each row
    dt: float
    horizon: float
    num_gpus: int

    def fractions(self) -> np.ndarray:
        """Share of each cell's GPU-time per state (rows, states, bins)."""
        cap = self.row_gpus[:, None, None] * self.dt
        return self.seconds / cap

    def cluster_fractions(self) -> np.ndarray:
        """Share of the whole cluster's GPU-time per state and bin (states, bins)."""
        return self.seconds.sum(axis=0) / (self.num_gpus * self.dt)

    def dominant(self) -> np.ndarray:
        """Most common state per cell (rows, bins); ``len(STATE_ORDER)`` where unrecorded."""
        frac = self.fractions()
        dom = frac.argmax(axis=1)
        dom[frac.sum(axis=1) < 0.5] = len(STATE_ORDER)
        return dom


_GRID_CHUNK = 1_000_000  # intervals binned at once: bounds the temporaries' memory
_GRIDS: dict[tuple[int, int, float, int, int], tuple[Spans, Grid]] = {}


def grid(sp: Spans, num_gpus: int, horizon: float, *, max_rows: int = 128, bins: int = 600) -> Grid:
    """:func:`binned_grid`, computed once per run inside :func:`cached` (a timeline and its
    utilization plot bin the same run alike)."""
    if not _caching:
        return binned_grid(sp, num_gpus, horizon, max_rows=max_rows, bins=bins)
    key = (id(sp), num_gpus, float(horizon), max_rows, bins)
    hit = _GRIDS.get(key)
    if hit is not None and hit[0] is sp:
        return hit[1]
    g = binned_grid(sp, num_gpus, horizon, max_rows=max_rows, bins=bins)
    if len(_GRIDS) >= _CACHE_SIZE:
        _GRIDS.pop(next(iter(_GRIDS)))
    _GRIDS[key] = (sp, g)
    return g


def binned_grid(sp: Spans, num_gpus: int, horizon: float, *, max_rows: int = 128, bins: int = 600) -> Grid:
    """Bin GPU-time onto at most ``max_rows`` GPU rows and ``bins`` time bins, exactly.

    Each interval contributes its exact overlap with every (row, bin) cell: partial first
    and last bins directly, the bins in between through a difference array, so the cost is
    O(intervals + cells) however long the intervals are.
    """
    builder = GridBuilder(num_gpus, horizon, max_rows=max_rows, bins=bins)
    builder.add(sp)
    return builder.finish()


class GridBuilder:
    """:func:`binned_grid` fed a piece of the spans at a time (a record read by row group).

    The pieces are binned in blocks of exactly ``_GRID_CHUNK`` spans, counted from the first
    span, whatever the pieces' sizes: the sums then run in the same order as one call over
    all spans, so the grid is the same to the last bit (the report's plots do not depend on
    how the record was read)."""

    def __init__(self, num_gpus: int, horizon: float, *, max_rows: int = 128, bins: int = 600) -> None:
        self.num_gpus, self.max_rows, self.bins = num_gpus, max_rows, bins
        self.horizon = max(horizon, 1e-12)
        self.g = max(1, -(-num_gpus // max_rows))
        self.rows = -(-num_gpus // self.g)
        self.dt = self.horizon / bins
        self.size = self.rows * len(STATE_ORDER) * (bins + 1)
        self.direct = np.zeros(self.size)
        self.diff = np.zeros(self.size)
        self.bounds = np.arange(self.rows + 1) * self.g
        self.bounds[-1] = num_gpus
        self._pending: list[Spans] = []
        self._pending_n = 0

    def add(self, sp: Spans) -> None:
        if sp.start.size == 0:
            return
        self._pending.append(sp)
        self._pending_n += sp.start.size
        if self._pending_n < _GRID_CHUNK:
            return
        whole = _concat(self._pending)
        n = whole.start.size - whole.start.size % _GRID_CHUNK
        for lo in range(0, n, _GRID_CHUNK):
            self._bin(whole.where(slice(lo, lo + _GRID_CHUNK)))
        rest = whole.where(slice(n, None))
        self._pending, self._pending_n = ([rest] if rest.start.size else []), rest.start.size

    def finish(self) -> Grid:
        if self._pending:
            self._bin(_concat(self._pending))
            self._pending, self._pending_n = [], 0
        nst, bins = len(STATE_ORDER), self.bins
        full = np.cumsum(self.diff.reshape(self.rows * nst, bins + 1), axis=1) * self.dt
        seconds = (self.direct.reshape(self.rows * nst, bins + 1) + full)[:, :bins].reshape(self.rows, nst, bins)
        row_gpus = np.minimum(self.g, self.num_gpus - np.arange(self.rows) * self.g)
        return Grid(seconds, self.g, row_gpus, self.dt, self.horizon, self.num_gpus)

    def _bin(self, sp: Spans) -> None:
        dt, bins, nst, size = self.dt, self.bins, len(STATE_ORDER), self.size

        def add(into: np.ndarray, at: np.ndarray, weights: np.ndarray) -> None:
            into += np.bincount(at, weights=weights, minlength=size)

        idx, row, w = split_ranges(sp.gpu_first.astype(np.int64), sp.gpu_count.astype(np.int64), self.bounds)
        w = w.astype(np.float64)
        s, e, st = sp.start[idx], sp.end[idx], sp.state[idx].astype(np.int64)
        b0 = np.minimum((s / dt).astype(np.int64), bins - 1)
        b1 = np.minimum((e / dt).astype(np.int64), bins - 1)
        base = (row * nst + st) * (bins + 1)
        same = b0 == b1
        m = ~same
        add(self.direct, base[same] + b0[same], w[same] * (e[same] - s[same]))
        add(self.direct, base[m] + b0[m], w[m] * ((b0[m] + 1) * dt - s[m]))
        add(self.direct, base[m] + b1[m], w[m] * (e[m] - b1[m] * dt))
        add(self.diff, base[m] + b0[m] + 1, w[m])
        add(self.diff, base[m] + b1[m], -w[m])


def _concat(parts: list[Spans]) -> Spans:
    if len(parts) == 1:
        return parts[0]
    return Spans(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                   ("gpu_first", "gpu_count", "start", "end", "state")))
