"""Read a run record for analysis, with the checks the metrics rely on.

:func:`rlsched.cluster.record.read_run` checks that the files exist, parse, and are not
from a newer format. The analysis additionally needs certain meta fields and columns, GPU
states it knows and GPU ranges inside the cluster; a record that breaks any of these
would give silently wrong numbers, so it is rejected with one :class:`RecordError` line
naming the file and the field.

Only the event kinds the analysis uses are loaded (a seed-scale run records millions of
``Evict`` events); their per-kind counts are kept in ``meta["_event_counts"]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rlsched.cluster.config import MAX_SLOTS
from rlsched.cluster.errors import RecordError
from rlsched.cluster.ids import GpuState
from rlsched.cluster.record import RunRecord, read_run

from .intervals import state_codes

KNOWN_STATES = frozenset(s.value for s in GpuState)
# Event kinds whose rows (not only counts) the analysis reads.
EVENT_KINDS = ("SandboxQueued", "SandboxAcquired", "SyncStart", "SyncEnd")
INTERVAL_COLUMNS = ("gpu_first", "gpu_count", "start", "end", "state")
TRAJECTORY_COLUMNS = (
    "trajectory", "step", "status", "trained_version", "min_version", "turns_total",
    "prompt_tokens", "output_tokens", "trained_tokens", "wasted_tokens", "dispatches",
    "migrations", "dispatch_time", "finish_time",
)
STEP_COLUMNS = ("version", "time")
EVENT_COLUMNS = ("time", "kind", "trajectory")


def load_run(path: str | Path, *, intervals: bool = True) -> RunRecord:
    """Read and check a run directory for the report (events filtered, see module doc).

    ``intervals=False`` leaves the GPU intervals on disk (the record's ``intervals`` is an
    empty frame with their columns): :func:`rlsched.analysis.stream.summarize_intervals`
    reads them in one pass instead, which is how the report handles seed-scale records."""
    rec = read_run(path, tables=("trajectories", "steps"))
    f = rec.path / "events.parquet"
    try:
        kinds = pq.read_table(f, columns=["kind"], read_dictionary=["kind"]).column("kind")
        counts = _counts(kinds)
        events = pd.read_parquet(
            f, columns=list(EVENT_COLUMNS), filters=[("kind", "in", list(EVENT_KINDS))]
        )
    except Exception as exc:  # pyarrow raises many types for corrupt or foreign files
        raise RecordError(f"{f}: unreadable events ({str(exc).splitlines()[0][:120]})") from None
    f = rec.path / "intervals.parquet"
    if not intervals:
        meta = {**rec.meta, "_event_counts": counts}
        out = RunRecord(rec.path, meta, events, empty_intervals(), rec.trajectories, rec.steps)
        check_record(out)
        return out
    try:
        # a seed-scale record has millions of intervals but eight states: read the state
        # column dictionary-encoded (a categorical, 1 byte a row) instead of as strings
        table = pq.read_table(f, columns=list(INTERVAL_COLUMNS), read_dictionary=["state"])
        intervals = table.to_pandas(self_destruct=True, split_blocks=True)
        del table
    except Exception as exc:
        raise RecordError(f"{f}: corrupt Parquet ({str(exc).splitlines()[0][:120]})") from None
    meta = {**rec.meta, "_event_counts": counts}
    out = RunRecord(rec.path, meta, events, intervals, rec.trajectories, rec.steps)
    check_record(out)
    return out


def empty_intervals() -> pd.DataFrame:
    """An intervals table with no rows (the record's intervals are read from disk later)."""
    return pd.DataFrame({
        "gpu_first": pd.Series(dtype="int32"), "gpu_count": pd.Series(dtype="int32"),
        "start": pd.Series(dtype="float64"), "end": pd.Series(dtype="float64"), "state": pd.Series(dtype="str"),
    })


def _counts(kinds: Any) -> dict[str, int]:
    """Rows per event kind. A dictionary-encoded column (millions of rows, a dozen kinds)
    is counted on its indices, chunk by chunk (chunks may have different dictionaries)."""
    if not pa.types.is_dictionary(kinds.type):
        vc = pc.value_counts(kinds)
        return {str(v["values"]): int(v["counts"]) for v in vc.to_pylist() if v["values"] is not None}
    out: dict[str, int] = {}
    for chunk in kinds.chunks:
        idx = chunk.indices.drop_null().to_numpy(zero_copy_only=False)
        for name, n in zip(chunk.dictionary.to_pylist(), np.bincount(idx, minlength=len(chunk.dictionary)), strict=True):
            if n:
                out[str(name)] = out.get(str(name), 0) + int(n)
    return out


def event_counts(record: RunRecord) -> dict[str, int]:
    """Events per kind: from :func:`load_run`'s full count, else from the loaded events."""
    counts = record.meta.get("_event_counts")
    if isinstance(counts, dict):
        return counts
    if record.events.empty or "kind" not in record.events:
        return {}
    return {str(k): int(n) for k, n in record.events["kind"].value_counts().items()}


def _require_columns(df: pd.DataFrame, cols: tuple[str, ...], file: Path) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise RecordError(f"{file}: missing column(s) {', '.join(missing)}; not a run record this rlsched reads")


def _numbers(col: pd.Series) -> bool:
    """Numbers (both drivers write these columns as integers or floats; NaN is a float)."""
    return pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col)


def _require_numbers(df: pd.DataFrame, cols: tuple[str, ...], file: Path) -> None:
    """Columns the analysis computes with must hold numbers (a record rewritten with text
    columns was a TypeError deep in the report)."""
    if df.empty:
        return  # (a run stopped at once writes its tables without rows, and untyped)
    for c in cols:
        if c in df.columns and not _numbers(df[c]):
            raise RecordError(f"{file}: column {c} holds {df[c].dtype} values: expected numbers; "
                              "not a run record this rlsched reads")


def _number(meta: dict[str, Any], key: str, file: Path, *, integer: bool, minimum: float) -> float:
    v = meta.get(key)
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    if ok and integer:
        ok = float(v).is_integer()
    if not ok or v < minimum:
        kind = "an integer" if integer else "a finite number"
        raise RecordError(f"{file}: field {key}={v!r}: expected {kind} >= {minimum:g}")
    return float(v)


def check_record(record: RunRecord) -> None:
    """Raise :class:`RecordError` if the record cannot be analysed (see module doc)."""
    d = record.path
    meta_file = d / "meta.json"
    if not isinstance(record.meta.get("policy"), str) or not record.meta["policy"]:
        raise RecordError(f"{meta_file}: field policy={record.meta.get('policy')!r}: expected the policy spec string")
    num_gpus = int(_number(record.meta, "num_gpus", meta_file, integer=True, minimum=1))
    if num_gpus > MAX_SLOTS:  # (1e12 was "out of memory: ... fewer --gpus", flags report has not)
        raise RecordError(f"{meta_file}: field num_gpus={num_gpus}: expected at most {MAX_SLOTS:,}")
    if record.meta.get("num_steps") is not None:  # ("x" was a ValueError traceback in the report)
        _number(record.meta, "num_steps", meta_file, integer=True, minimum=0)
    complete = record.meta.get("complete")
    if complete is not None and not isinstance(complete, bool):  # ("no" read as complete)
        raise RecordError(f"{meta_file}: field complete={complete!r}: expected true or false")
    _number(record.meta, "makespan_seconds", meta_file, integer=False, minimum=0)
    lb = record.meta.get("lower_bound_seconds")
    if lb is not None:
        _number(record.meta, "lower_bound_seconds", meta_file, integer=False, minimum=0)
    iv = record.intervals
    ivf = d / "intervals.parquet"
    _require_columns(iv, INTERVAL_COLUMNS, ivf)
    _require_columns(record.trajectories, TRAJECTORY_COLUMNS, d / "trajectories.parquet")
    _require_columns(record.steps, STEP_COLUMNS, d / "steps.parquet")
    _require_numbers(iv, INTERVAL_COLUMNS[:4], ivf)
    _require_numbers(record.trajectories, (*TRAJECTORY_COLUMNS[3:], "step"), d / "trajectories.parquet")
    _require_numbers(record.steps, STEP_COLUMNS, d / "steps.parquet")
    if not record.events.empty or len(record.events.columns):
        _require_columns(record.events, EVENT_COLUMNS, d / "events.parquet")
    if iv.empty:
        return
    check_interval_rows(ivf, 0, state_codes(iv["state"]), lambda i: iv["state"].iloc[i], iv["gpu_first"].to_numpy(),
                        iv["gpu_count"].to_numpy(), iv["start"].to_numpy(dtype=float),
                        iv["end"].to_numpy(dtype=float), num_gpus)


def check_interval_rows(file: Path, offset: int, codes: np.ndarray, state_at: Callable[[int], object],
                        first: np.ndarray, count: np.ndarray, start: np.ndarray, end: np.ndarray,
                        num_gpus: int) -> None:
    """The row checks of ``intervals.parquet`` (known state, GPUs inside the cluster, end not
    before start), whole or one row group at a time (``offset``: the group's first row, so
    the message names the file's row)."""
    bad = codes < 0
    if bad.any():
        i = int(bad.argmax())
        raise RecordError(
            f"{file}: row {offset + i}: state={state_at(i)!r}: expected one of {', '.join(sorted(KNOWN_STATES))}"
        )
    out_of_range = (first < 0) | (count < 1) | (first + count > num_gpus)
    if out_of_range.any():
        i = int(out_of_range.argmax())
        raise RecordError(
            f"{file}: row {offset + i}: GPUs {first[i]}..{first[i] + count[i] - 1} outside the cluster's "
            f"{num_gpus} GPUs (meta num_gpus)"
        )
    backwards = ~(end >= start)  # also catches NaN
    if backwards.any():
        i = int(backwards.argmax())
        raise RecordError(f"{file}: row {offset + i}: end={float(end[i]):g} before start={float(start[i]):g} "
                          "(expected finite times, end >= start)")
