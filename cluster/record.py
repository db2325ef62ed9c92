"""The run-record format both drivers write and the analysis reads.

A run record is a directory:

``meta.json``
    ``{"format": "rlsched-run", "version": 1, "driver": "sim"|"live", "policy": SPEC,
    "num_gpus", "tp", "num_steps", "complete": bool, ...}`` plus whatever configuration
    the driver wants to keep (cost model, trace path, seed, wall time). A run of a trace
    file records that file's ``trace_sha256`` and ``trace_bytes`` beside ``trace`` (what
    was replayed, whatever the path holds later; ``rlsched.traces.digest``). A simulated run
    with fault injection adds ``fault_schedule`` (the ``[faults]`` table as run) and
    ``faults`` (what fired: counts per kind, retried trajectories, time lost); a resumed
    live run adds ``resumes`` (one entry per ``--resume``, with the trajectories re-run).
``events.parquet``
    One row per notable event: ``time`` (s), ``kind`` (event or command name), ``step``,
    ``version``, ``engine``, ``gpu`` (-1 when not applicable), ``trajectory`` ("" when not
    applicable), ``detail`` (short free text).
``intervals.parquet``
    Per-GPU state intervals: GPUs ``gpu_first .. gpu_first+gpu_count-1`` were in ``state``
    (a :class:`~rlsched.cluster.ids.GpuState` value) from ``start`` to ``end``. Intervals
    of one GPU never overlap and, together, cover ``[0, makespan]``. ``step`` is the step
    the work belonged to (-1: none).
``trajectories.parquet``
    One row per trajectory of the run (columns in :data:`TRAJECTORY_COLUMNS`).
``steps.parquet``
    One row per optimizer step (columns in :data:`STEP_COLUMNS`).

Columns only grow between versions; readers reject a newer major ``version``.
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import RecordError
from .ids import GpuState

FORMAT = "rlsched-run"
FORMAT_VERSION = 1

EVENT_SCHEMA = pa.schema(
    [
        ("time", pa.float64()),
        ("kind", pa.string()),
        ("step", pa.int32()),
        ("version", pa.int32()),
        ("engine", pa.int32()),
        ("gpu", pa.int32()),
        ("trajectory", pa.string()),
        ("detail", pa.string()),
    ]
)
INTERVAL_SCHEMA = pa.schema(
    [
        ("gpu_first", pa.int32()),
        ("gpu_count", pa.int32()),
        ("start", pa.float64()),
        ("end", pa.float64()),
        ("state", pa.string()),
        ("step", pa.int32()),
    ]
)
# the interval buffers hold a state as its index here (see RunRecorder.interval_buffers)
GPU_STATE_NAMES: tuple[str, ...] = tuple(s.value for s in GpuState)
GPU_STATE_CODE: dict[str, int] = {name: i for i, name in enumerate(GPU_STATE_NAMES)}
_STATE_NAMES = pa.array(GPU_STATE_NAMES, type=pa.string())
# the interval buffers' element types (the state as its code)
_TYPECODE = {"gpu_first": "i", "gpu_count": "i", "start": "d", "end": "d", "state": "b", "step": "i"}
_DTYPE = {name: np.dtype(code) for name, code in _TYPECODE.items()}
_ITEMSIZE = {name: dt.itemsize for name, dt in _DTYPE.items()}
TRAJECTORY_COLUMNS = {
    "trajectory": "str: id, unique in the run",
    "task_id": "str",
    "step": "int: the step whose batch it belongs to",
    "status": "str: final TrajStatus (trained, dropped, done, interrupted, ...)",
    "finish_status": "str: how generation ended (done, timed_out, failed, interrupted)",
    "dispatch_time": "float: first dispatch (s)",
    "finish_time": "float: last time generation stopped (s)",
    "trained_version": "int: trainer version it was trained at (-1: not trained)",
    "min_version": "int: oldest weights version among its kept tokens",
    "max_version": "int: newest weights version among its kept tokens",
    "turns_total": "int: turns in the trace",
    "turns_done": "int: turns finished and kept",
    "prompt_tokens": "int: prompt tokens of kept turns",
    "output_tokens": "int: generated tokens of kept turns",
    "trained_tokens": "int: tokens the trainer was charged for (after the processor)",
    "wasted_tokens": "int: generated tokens thrown away (restarts, drops)",
    "dispatches": "int: times dispatched (1 + resumes/retries)",
    "migrations": "int: times its context moved to another engine",
    "solo_seconds": "float: its kept turns alone on an engine under the run's cost model (batch "
                    "1, prefix cache hit, tools never queued; the bound's critical path of a trajectory): a "
                    "lower bound on finish_time - dispatch_time (simulator; NaN or absent from a live run)",
}
STEP_COLUMNS = {
    "version": "int: version after this optimizer step (1..num_steps)",
    "time": "float: when the optimizer step finished (s)",
    "trajectories": "int: trajectories in the step",
    "trained_tokens": "int",
    "train_seconds": "float: trainer busy time for this step (micro-batches + optimizer)",
    "max_staleness": "int: largest staleness among its trajectories",
}


def _state_code(state: str) -> int:
    try:
        return GPU_STATE_CODE[state]
    except KeyError:
        raise ValueError(f"interval state {state!r}: expected one of {', '.join(GPU_STATE_NAMES)}") from None


class RunRecorder:
    """Collects events and intervals in columns and flushes them in row groups, so a
    seed-scale run never holds millions of Python tuples.

    Intervals go into fixed-size typed arrays (one row group's worth), not Python lists:
    a seed-scale simulation writes ~8 million of them, and turning lists of boxed floats
    into Arrow columns cost ~10% of the whole run; from the arrays a row group is a copy."""

    def __init__(self, directory: Path, flush_rows: int = 200_000) -> None:
        if flush_rows < 1:
            raise ValueError(f"flush_rows={flush_rows}: expected at least 1")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._flush_rows = flush_rows
        self._ev: dict[str, list[Any]] = {f.name: [] for f in EVENT_SCHEMA}
        # (array.array, not numpy: Python-level stores into it are ~2x cheaper)
        self._iv: dict[str, array] = {
            f.name: array(_TYPECODE[f.name], bytes(flush_rows * _ITEMSIZE[f.name]))
            for f in INTERVAL_SCHEMA
        }
        self._iv_n = array("q", [0])  # rows pending in self._iv
        self._ev_writer = pq.ParquetWriter(self.dir / "events.parquet", EVENT_SCHEMA)
        # (only the state column repeats: dictionary-encoding the numbers too made each
        # row group ~4x slower to write)
        self._iv_writer = pq.ParquetWriter(self.dir / "intervals.parquet", INTERVAL_SCHEMA,
                                           use_dictionary=["state"])
        self.event_rows = 0
        self.interval_rows = 0

    def event(
        self, time: float, kind: str, *, step: int = -1, version: int = -1, engine: int = -1,
        gpu: int = -1, trajectory: str = "", detail: str = "",
    ) -> None:
        ev = self._ev
        ev["time"].append(time)
        ev["kind"].append(kind)
        ev["step"].append(step)
        ev["version"].append(version)
        ev["engine"].append(engine)
        ev["gpu"].append(gpu)
        ev["trajectory"].append(trajectory)
        ev["detail"].append(detail)
        if len(ev["time"]) >= self._flush_rows:
            self._flush_events()

    def interval(
        self, gpu_first: int, gpu_count: int, start: float, end: float, state: str, step: int = -1
    ) -> None:
        if end <= start:
            return
        code = _state_code(state)
        iv, i = self._iv, self._iv_n[0]
        iv["gpu_first"][i] = gpu_first
        iv["gpu_count"][i] = gpu_count
        iv["start"][i] = start
        iv["end"][i] = end
        iv["state"][i] = code
        iv["step"][i] = step
        self._iv_n[0] = i + 1
        if i + 1 >= self._flush_rows:
            self._flush_intervals()

    def intervals(
        self, firsts: array, counts: array, start: float, end: float, state: str, step: int = -1
    ) -> None:
        """:meth:`interval` for several GPU ranges with one start, end, state and step
        (``firsts``/``counts``: ``array('i')`` of equal length), written as slices."""
        if end <= start:
            return
        code = _state_code(state)
        iv, cap = self._iv, self._flush_rows
        done, n = 0, len(firsts)
        while done < n:
            i = self._iv_n[0]
            k = min(n - done, cap - i)
            j = i + k
            iv["gpu_first"][i:j] = firsts[done:done + k]
            iv["gpu_count"][i:j] = counts[done:done + k]
            iv["start"][i:j] = array("d", [start]) * k
            iv["end"][i:j] = array("d", [end]) * k
            iv["state"][i:j] = array("b", [code]) * k
            iv["step"][i:j] = array("i", [step]) * k
            self._iv_n[0] = j
            done += k
            if j >= cap:
                self._flush_intervals()

    def interval_buffers(self) -> tuple[array, ...]:
        """The arrays :meth:`interval` writes rows into, in ``INTERVAL_SCHEMA`` order (the
        state as its index in :data:`GPU_STATE_NAMES`), then the one-element count of
        pending rows. The simulator's per-turn code writes row ``n[0]`` itself, bumps
        ``n[0]`` and calls :meth:`flush_full` when it reaches :attr:`flush_rows` (a Python
        call per GPU state change cost ~20% of a seed-scale run). A flush resets the count,
        not the arrays: they stay valid for the recorder's lifetime."""
        return (*(self._iv[name] for name in INTERVAL_SCHEMA.names), self._iv_n)

    @property
    def flush_rows(self) -> int:
        return self._flush_rows

    def flush_full(self) -> None:
        """Write the pending intervals if there are :attr:`flush_rows` of them."""
        if self._iv_n[0] >= self._flush_rows:
            self._flush_intervals()

    def _flush_events(self) -> None:
        if self._ev["time"]:
            self._ev_writer.write_table(pa.table(self._ev, schema=EVENT_SCHEMA))
            self.event_rows += len(self._ev["time"])
            for v in self._ev.values():
                v.clear()

    def _flush_intervals(self) -> None:
        n = self._iv_n[0]
        if not n:
            return
        cols = []
        for f in INTERVAL_SCHEMA:
            col = pa.array(np.frombuffer(self._iv[f.name], dtype=_DTYPE[f.name], count=n))
            cols.append(_STATE_NAMES.take(col) if f.name == "state" else col)
        self._iv_writer.write_table(pa.Table.from_arrays(cols, schema=INTERVAL_SCHEMA))
        self.interval_rows += n
        self._iv_n[0] = 0

    def close(
        self, trajectories: pd.DataFrame, steps: pd.DataFrame, meta: dict[str, Any]
    ) -> None:
        self._flush_events()
        self._flush_intervals()
        self._ev_writer.close()
        self._iv_writer.close()
        trajectories.to_parquet(self.dir / "trajectories.parquet", index=False)
        steps.to_parquet(self.dir / "steps.parquet", index=False)
        full = {"format": FORMAT, "version": FORMAT_VERSION, **meta}
        (self.dir / "meta.json").write_text(json.dumps(_jsonable(full), indent=2) + "\n")


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    return obj



def ids_text(xs: Iterable[int]) -> str:
    """GPU or engine ids as an event's short detail text: ``"4-7"`` for a contiguous range,
    else ``"1,5,9"`` (both drivers write them this way, so records compare as text)."""
    xs = sorted(xs)
    if not xs:
        return ""
    if xs == list(range(xs[0], xs[-1] + 1)):
        return f"{xs[0]}-{xs[-1]}" if len(xs) > 1 else str(xs[0])
    return ",".join(map(str, xs))


@dataclass(frozen=True)
class RunRecord:
    """A run record read back: meta plus its four tables as DataFrames."""

    path: Path
    meta: dict[str, Any]
    events: pd.DataFrame
    intervals: pd.DataFrame
    trajectories: pd.DataFrame
    steps: pd.DataFrame


_FILES = ("meta.json", "events.parquet", "intervals.parquet", "trajectories.parquet", "steps.parquet")


def runs_in(d: Path) -> list[Path]:
    """The run records an output folder of ``rlsched compare``/``run`` holds under ``runs/``
    (none when ``d`` is itself a run record or holds no ``runs/``)."""
    runs = d / "runs"
    if (d / "meta.json").exists() or not runs.is_dir():
        return []
    return sorted(p for p in runs.iterdir() if (p / "meta.json").is_file())


def single_run_dir(d: Path) -> Path:
    """``d`` itself, or the one run record under ``d/runs/`` when ``d`` is an output folder
    (no ``meta.json`` of its own). An output folder of several runs is refused in one line
    naming them: which one was meant is the user's choice."""
    found = runs_in(d)
    if len(found) == 1:
        return found[0]
    if not found:
        return d
    names = ", ".join(str(p) for p in found[:3]) + (", ..." if len(found) > 3 else "")
    raise RecordError(f"{d}: holds {len(found)} run records ({names}); name one of them")


def read_run(path: str | Path, *, tables: tuple[str, ...] = ("events", "intervals", "trajectories", "steps")) -> RunRecord:
    """Read a run directory; any problem is one RecordError line naming the file.

    The output folder of ``rlsched run`` (simulated or ``--live``) holds its one run record
    under ``runs/``; given such a folder, that record is read, so every command that takes
    one run accepts the folder the user named with ``--out``."""
    d = single_run_dir(Path(path))
    if not d.is_dir():
        raise RecordError(f"{d}: not a run directory (expected the folder `rlsched compare/run` wrote)")
    for name in _FILES:
        if not (d / name).is_file():
            raise RecordError(f"{d}: missing {name}; not a complete rlsched run record")
    try:
        meta = json.loads((d / "meta.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordError(f"{d / 'meta.json'}: unreadable ({exc.__class__.__name__})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise RecordError(f"{d / 'meta.json'}: not an rlsched run record (format field)")
    version = meta.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise RecordError(
            f"{d / 'meta.json'}: record version {version!r} is newer than this rlsched reads "
            f"({FORMAT_VERSION}); upgrade rlsched"
        )
    frames: dict[str, pd.DataFrame] = {}
    for name in ("events", "intervals", "trajectories", "steps"):
        if name not in tables:
            frames[name] = pd.DataFrame()
            continue
        f = d / f"{name}.parquet"
        try:
            frames[name] = pd.read_parquet(f)
        except Exception as exc:  # pyarrow raises many types for corrupt files
            raise RecordError(f"{f}: corrupt Parquet ({str(exc).splitlines()[0][:120]})") from None
    return RunRecord(d, meta, frames["events"], frames["intervals"], frames["trajectories"], frames["steps"])
