"""Where the GPU-time went: by state, and by *cause* of idleness; and the idle bubbles.

The recorded states say what a GPU was doing; the causes say why it was not computing,
which is what a scheduling policy can change:

* ``tool_wait`` is split into plain tool time and time while the **sandbox pool was
  saturated** (a tool call waited for a slot: ``SandboxQueued`` events). The wait ends at
  the matching ``SandboxAcquired`` event when the driver records one; otherwise the
  saturated span is estimated from bursts of ``SandboxQueued`` events and marked so.
* ``rollout_idle`` is split into waiting on the **long tail** (other engines still hold
  trajectories: some GPU is generating or in tool time) and **no rollout work** (every
  engine is empty: waiting for new weights or the next batch).
* ``sync`` stays one row: the record marks only ``SyncStart``/``SyncEnd``, so draining /
  pausing and the weight transfer itself cannot be told apart (the note says so).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from rlsched.cluster.ids import GpuState
from rlsched.cluster.record import RunRecord

from .intervals import STATE_INDEX, gap_segments, overlap, seconds_by_state, spans, union
from .metrics import BUSY, label, makespan
from .style import STATE_LABELS, UNRECORDED

if TYPE_CHECKING:
    from .stream import IntervalSummary

BREAKDOWN_COLUMNS = ("policy", "state", "cause", "gpu_seconds", "fraction", "note")
SANDBOX_BURST_GAP_S = 60.0  # queue events closer than this belong to one saturated span

G = GpuState


def sandbox_windows(record: RunRecord) -> tuple[np.ndarray, np.ndarray, str]:
    ev = record.events
    if ev.empty:
        return np.empty(0), np.empty(0), ""
    kind = ev["kind"].astype(str)
    q = ev[kind == "SandboxQueued"]
    if q.empty:
        return np.empty(0), np.empty(0), ""
    a = ev[kind == "SandboxAcquired"]
    if not a.empty:
        qs = pd.DataFrame({"time": q["time"].to_numpy(float), "trajectory": q["trajectory"].astype(str).to_numpy()})
        acq = pd.DataFrame({"acquired": a["time"].to_numpy(float), "trajectory": a["trajectory"].astype(str).to_numpy()})
        m = pd.merge_asof(
            qs.sort_values("time"), acq.sort_values("acquired"), left_on="time", right_on="acquired",
            by="trajectory", direction="forward",
        )
        end = m["acquired"].fillna(makespan(record)).to_numpy()
        s, e = union(m["time"].to_numpy(), end)
        return s, e, f"{len(q)} tool calls queued for a sandbox slot"
    t = np.sort(q["time"].to_numpy(float))
    new = np.concatenate([[True], np.diff(t) > SANDBOX_BURST_GAP_S])
    first = np.flatnonzero(new)
    last = np.concatenate([first[1:], [t.size]]) - 1
    return t[first], t[last], (
        f"{len(q)} tool calls queued for a sandbox slot; estimated from bursts of SandboxQueued "
        "events (the record has no SandboxAcquired events)"
    )


def breakdown(record: RunRecord, streamed: IntervalSummary | None = None) -> pd.DataFrame:
    """GPU-seconds and share of all GPU-time per (state, cause); rows sum to 1.

    ``streamed``: the record's intervals reduced in one pass (its ``intervals`` frame is
    then not read); without it, the intervals in memory are used."""
    span = makespan(record)
    ws, we, note = sandbox_windows(record)
    if streamed is not None:
        secs, saturated, tail = streamed.seconds, streamed.saturated_tool_seconds, streamed.tail_idle_seconds
    else:
        sp = spans(record.intervals, span)
        secs = seconds_by_state(sp)
        tw = sp.of_states(G.TOOL_WAIT.value)
        saturated = float((overlap(tw.start, tw.end, ws, we) * tw.gpu_count).sum())
        work = sp.of_states(G.GENERATE.value, G.TOOL_WAIT.value)
        us, ue = union(work.start, work.end)
        ri = sp.of_states(G.ROLLOUT_IDLE.value)
        tail = float((overlap(ri.start, ri.end, us, ue) * ri.gpu_count).sum())
    total = int(record.meta["num_gpus"]) * span

    def s(state: GpuState) -> float:
        return float(secs[STATE_INDEX[state.value]])

    rows: list[tuple[str, str, float, str]] = [(G.GENERATE, STATE_LABELS[G.GENERATE], s(G.GENERATE), "")]
    rows.append((G.TOOL_WAIT, "waiting on tools", s(G.TOOL_WAIT) - saturated, ""))
    rows.append((G.TOOL_WAIT, "waiting on a saturated sandbox pool", saturated, note))
    rows.append((G.ROLLOUT_IDLE, "waiting on the long tail", tail, "other engines still held trajectories"))
    rows.append((
        G.ROLLOUT_IDLE, "no rollout work", s(G.ROLLOUT_IDLE) - tail,
        "every engine empty: waiting for new weights or the next batch",
    ))
    rows.append((
        G.SYNC, STATE_LABELS[G.SYNC], s(G.SYNC),
        "drain/pause and transfer not separated: the record marks only SyncStart/SyncEnd",
    ))
    for st in (G.SWITCH, G.TRAIN, G.TRAIN_IDLE, G.IDLE):
        rows.append((st, STATE_LABELS[st], s(st), ""))
    if s(G.FAILED) > 0:  # (only with fault injection)
        rows.append((G.FAILED, STATE_LABELS[G.FAILED], s(G.FAILED), "down until it recovers (failed_gpu_seconds)"))
    missing = total - float(secs.sum())
    if missing > 1e-9 * max(total, 1.0):
        rows.append((UNRECORDED, "not covered by any interval", missing, "the driver left gaps in intervals.parquet"))
    df = pd.DataFrame(rows, columns=["state", "cause", "gpu_seconds", "note"])
    df["state"] = df["state"].astype(str)
    df["gpu_seconds"] = df["gpu_seconds"].clip(lower=0.0)
    df["fraction"] = df["gpu_seconds"] / total if total > 0 else np.nan
    df.insert(0, "policy", label(record))
    return df[list(BREAKDOWN_COLUMNS)]


def bubble_lengths(record: RunRecord) -> pd.DataFrame:
    """Every idle bubble: a maximal stretch of a GPU's time in ``[0, makespan]`` with no
    busy state (generate/train), gaps in the record included.

    Like the record's intervals, rows are per GPU range: columns gpu_first, gpu_count
    (each of these GPUs has this bubble), start, seconds."""
    span = makespan(record)
    busy = spans(record.intervals, span).of_states(*BUSY)
    return gap_segments(busy, int(record.meta["num_gpus"]), span)


_BUCKET_SHIFT = 44  # a double's sign, exponent and top 8 mantissa bits: ~0.4% wide buckets


def _weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs: tuple[int, ...]) -> list[float]:
    """Nearest-rank percentiles where each value counts ``weight`` times: for each ``q``
    the smallest value ``v`` whose values ``<= v`` weigh at least ``q``% of the total.

    A seed-scale run has millions of bubbles; sorting them all took most of the report's
    time per run. Non-negative doubles order like their bit patterns, so the values are
    first counted into buckets by their top bits (one pass), and only the bucket where
    each percentile falls is sorted. Exact: the same values a full sort gives."""
    w = np.asarray(weights)
    targets = np.asarray(qs, dtype=float) / 100.0 * float(w.sum())
    if values.size < 100_000 or not (values >= 0).all():
        order = np.argsort(values)
        cum = np.cumsum(w[order])
        return [float(v) for v in values[order][np.searchsorted(cum, targets)]]
    key = np.ascontiguousarray(values, dtype=np.float64).view(np.int64) >> _BUCKET_SHIFT
    cum = np.cumsum(np.bincount(key, weights=w))  # integer weights: exact in float64
    out = []
    for t in targets:
        if t <= 0:  # (q = 0: the first value of all, which an empty bucket 0 would hide)
            out.append(float(values.min()))
            continue
        b = int(np.searchsorted(cum, t))
        below = float(cum[b - 1]) if b > 0 else 0.0
        pick = key == b
        v, vw = values[pick], w[pick]
        order = np.argsort(v)
        out.append(float(v[order][np.searchsorted(below + np.cumsum(vw[order]), t)]))
    return out


def bubbles(record: RunRecord, streamed: IntervalSummary | None = None) -> dict[str, object]:
    """Count, total, distribution and the longest of the run's idle bubbles (per GPU:
    a bubble shared by an engine's 4 GPUs counts 4 times). ``streamed``: as for
    :func:`breakdown` (it must have been made with ``full=True``)."""
    longest: tuple[float, int, float] | None
    if streamed is not None:
        if streamed.bubbles is None:
            raise ValueError("bubbles(): the interval summary was made without bubbles (full=False)")
        secs, w, longest = streamed.bubbles.seconds, streamed.bubbles.gpus, streamed.bubbles.longest
    else:
        b = bubble_lengths(record)
        secs = b["seconds"].to_numpy()
        w = b["gpu_count"].to_numpy()
        longest = None
        if secs.size:
            i = int(secs.argmax())
            longest = (float(secs[i]), int(b["gpu_first"].iat[i]), float(b["start"].iat[i]))
    n = int(w.sum())
    total = float((secs * w).sum())
    row: dict[str, object] = {"policy": label(record), "bubbles": n}
    row["bubbles_per_gpu"] = n / int(record.meta["num_gpus"])
    row["total_gpu_seconds"] = total
    row["mean_seconds"] = total / n if n else 0.0
    qs = (50, 90, 99)
    for q, v in zip(qs, _weighted_percentiles(secs, w, qs) if n else [0.0] * len(qs), strict=True):
        row[f"p{q}_seconds"] = v
    if n and longest is not None:
        row.update(longest_seconds=longest[0], longest_gpu=longest[1], longest_start=longest[2])
    else:
        row.update(longest_seconds=0.0, longest_gpu=-1, longest_start=float("nan"))
    return row
