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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rlsched.cluster.config import MAX_SLOTS
from rlsched.cluster.errors import RecordError, shown
from rlsched.cluster.ids import GpuState
from rlsched.cluster.record import RunRecord, read_run
from rlsched.traces.batches import MAX_TASK_DRAWS
from rlsched.traces.digest import TRACE_BYTES, TRACE_SHA256, is_sha256

from .intervals import state_codes

KNOWN_STATES = frozenset(s.value for s in GpuState)
DRIVERS = ("sim", "live")
#: The longest run (``makespan_seconds``, ``lower_bound_seconds``) a record may hold: about
#: 31,700 years. Past it float64 seconds no longer resolve a millisecond decode step, so no
#: run's figures mean anything; 1e308 s overflowed the report's GPU-seconds to inf.
MAX_RUN_SECONDS = 1e12
RUN_SECONDS_WHY = " (seconds: 1e+12 is about 31,700 years)"
#: The most optimizer steps a record may say it finished (``steps_done``, summary.csv's
#: ``steps``): every step draws at least one task, and no run draws more than
#: ``MAX_TASK_DRAWS``.
MAX_STEPS = MAX_TASK_DRAWS
#: The ``faults`` totals summary.csv reads (:func:`rlsched.analysis.metrics.fault_columns`).
FAULT_FIELDS = ("faults", "retried_trajectories", "wasted_tokens", "train_gpu_seconds_lost",
                "sync_gpu_seconds_lost", "failed_gpu_seconds", "tool_seconds_lost")
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


def _number(meta: Mapping[str, Any], key: str, file: Path, *, integer: bool, minimum: float,
            maximum: float | None = None, what: str = "") -> float:
    """``meta[key]`` as a number in ``[minimum, maximum]``, else one :class:`RecordError`
    line naming the file, the field, its value and what is expected (``what``: a reason
    for the range, said after it)."""
    v = meta.get(key)
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    if ok and integer:
        ok = float(v).is_integer()
    if not ok or v < minimum or (maximum is not None and v > maximum):
        kind = "an integer" if integer else "a finite number"
        most = "" if maximum is None else f" and at most {maximum:,.0f}" if integer else f" and at most {maximum:g}"
        raise RecordError(f"{file}: field {key}={shown(v)}: expected {kind} >= {minimum:g}{most}{what}")
    return float(v)


def _optional_number(meta: Mapping[str, Any], key: str, file: Path, **kw: Any) -> None:
    """:func:`_number` for a field that older records (or one driver) may lack or leave null."""
    if meta.get(key) is not None:
        _number(meta, key, file, **kw)


def _optional_type(meta: Mapping[str, Any], key: str, file: Path, kind: type, expected: str) -> None:
    v = meta.get(key)
    if v is not None and (not isinstance(v, kind) or isinstance(v, bool)):
        raise RecordError(f"{file}: field {key}={shown(v)}: expected {expected}")


def check_meta(meta: Mapping[str, Any], meta_file: Path) -> None:
    """Raise :class:`RecordError` for a ``meta.json`` field the analysis reads that no run
    can have written: a wrong type, NaN or infinity, a count below its floor, a number past
    float's useful range. An edited record with ``"tp": 0`` or ``"makespan_seconds": 1e308``
    gave a report of nonsense (utilization 0, an empty plot) without a word. Fields that
    older records lack are checked only when present."""
    if not isinstance(meta.get("policy"), str) or not meta["policy"]:
        raise RecordError(f"{meta_file}: field policy={shown(meta.get('policy'))}: expected the policy spec string")
    num_gpus = int(_number(meta, "num_gpus", meta_file, integer=True, minimum=1))
    if num_gpus > MAX_SLOTS:  # (1e12 was "out of memory: ... fewer --gpus", flags report has not)
        raise RecordError(f"{meta_file}: field num_gpus={num_gpus}: expected at most {MAX_SLOTS:,}")
    # engines are tp GPUs of the cluster's: both drivers refuse tp < 1 or above the GPUs
    _optional_number(meta, "tp", meta_file, integer=True, minimum=1, maximum=num_gpus,
                     what=f" (GPUs per engine, of num_gpus={num_gpus})")
    # ("x" was a ValueError traceback in the report)
    _optional_number(meta, "num_steps", meta_file, integer=True, minimum=0)
    # (-1 was summary.csv's steps, 1e300 silently replaced by the steps table's length)
    _optional_number(meta, "steps_done", meta_file, integer=True, minimum=0, maximum=MAX_STEPS)
    complete = meta.get("complete")
    if complete is not None and not isinstance(complete, bool):  # ("no" read as complete)
        raise RecordError(f"{meta_file}: field complete={shown(complete)}: expected true or false")
    _number(meta, "makespan_seconds", meta_file, integer=False, minimum=0, maximum=MAX_RUN_SECONDS,
            what=RUN_SECONDS_WHY)
    _optional_number(meta, "lower_bound_seconds", meta_file, integer=False, minimum=0,
                     maximum=MAX_RUN_SECONDS, what=RUN_SECONDS_WHY)
    _optional_number(meta, "max_staleness_bound", meta_file, integer=True, minimum=0)
    _optional_number(meta, "events_processed", meta_file, integer=True, minimum=0)
    driver = meta.get("driver")
    if driver is not None and driver not in DRIVERS:
        raise RecordError(f"{meta_file}: field driver={shown(driver)}: expected one of {', '.join(DRIVERS)}")
    for key in ("spec_as_given", "trace", "trace_resolved"):
        _optional_type(meta, key, meta_file, str, "a string")
    for key in ("config", "cost_model", "faults", "fault_schedule"):
        _optional_type(meta, key, meta_file, dict, "an object (or null)")
    faults = meta.get("faults") or {}
    for key in FAULT_FIELDS:  # (summary.csv's fault columns; -5 faults were shown as -5)
        _optional_number({f"faults.{key}": faults.get(key)}, f"faults.{key}", meta_file, integer=False,
                         minimum=0)
    sha = meta.get(TRACE_SHA256)
    if sha is not None and not is_sha256(sha):
        raise RecordError(f"{meta_file}: field {TRACE_SHA256}={shown(sha)}: expected the trace file's "
                          "SHA-256, 64 lowercase hex digits")
    _optional_number(meta, TRACE_BYTES, meta_file, integer=True, minimum=0)


def check_record(record: RunRecord) -> None:
    """Raise :class:`RecordError` if the record cannot be analysed (see module doc)."""
    d = record.path
    check_meta(record.meta, d / "meta.json")
    num_gpus = int(record.meta["num_gpus"])
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
    check_step_rows(record.steps, d / "steps.parquet")
    _require_unique(record.trajectories, "trajectory", d / "trajectories.parquet")
    if iv.empty:
        return
    check_interval_rows(ivf, 0, state_codes(iv["state"]), lambda i: iv["state"].iloc[i], iv["gpu_first"].to_numpy(),
                        iv["gpu_count"].to_numpy(), iv["start"].to_numpy(dtype=float),
                        iv["end"].to_numpy(dtype=float), num_gpus)


def _require_unique(df: pd.DataFrame, col: str, file: Path) -> None:
    """Each value of ``col`` once: both drivers write one row per trajectory and per
    optimizer step. A row written twice (a record concatenated or edited by hand) was a
    pandas traceback in the report (a step) or counted twice in every table (a trajectory)."""
    dup = df[col].duplicated(keep="first").to_numpy() if not df.empty else np.zeros(0, bool)
    if dup.any():
        i = int(dup.argmax())
        raise RecordError(f"{file}: row {i}: {col}={shown(df[col].iloc[i])} appears more than once: "
                          f"expected one row per {col}")


def check_step_rows(steps: pd.DataFrame, file: Path) -> None:
    """The steps table as the drivers write it: one row per optimizer step, its ``version``
    a whole number >= 1 (the weights that step made), its ``time`` finite, >= 0 and not
    before the previous version's. Versions need not start at 1 (a resumed live run's
    record starts at its first new version). A time that went backwards gave negative
    step seconds in step_times.csv and critical_path.csv without a word."""
    if steps.empty:
        return
    _require_columns(steps, STEP_COLUMNS, file)
    _require_numbers(steps, STEP_COLUMNS, file)
    version = steps["version"].to_numpy(dtype=float)
    bad = ~(version >= 1) | (version != np.floor(version))
    if bad.any():
        i = int(bad.argmax())
        raise RecordError(f"{file}: row {i}: version={shown(steps['version'].iloc[i])}: "
                          "expected a whole number >= 1 (the weights the step made)")
    _require_unique(steps, "version", file)
    time = steps["time"].to_numpy(dtype=float)
    bad = ~np.isfinite(time) | (time < 0)
    if bad.any():
        i = int(bad.argmax())
        raise RecordError(f"{file}: row {i}: time={shown(steps['time'].iloc[i])}: expected a finite "
                          "number of seconds >= 0")
    order = np.argsort(version, kind="stable")
    back = np.flatnonzero(np.diff(time[order]) < 0)
    if back.size:
        i, j = int(order[back[0]]), int(order[back[0] + 1])
        raise RecordError(f"{file}: row {j}: version {int(version[j])} ends at time={time[j]:g}, before "
                          f"version {int(version[i])} at {time[i]:g}: expected steps to end in version order")


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
