"""Reading and writing trace files (Parquet or JSONL).

Every failure a user can cause -- no file, empty file, a garbled or truncated Parquet file,
bad UTF-8, a line that is not a JSON object -- becomes a one-line :class:`TraceError`
naming the file (and the line, for JSONL). The frame is then checked by
:func:`~rlsched.traces.schema.validate_trace`.

Parquet files are written with one row group per RL step (when a ``step`` column exists) or
per block of whole trajectories otherwise, so a reader can load one step via the row-group
statistics (``load_trace(path, steps=[s])``) without reading the rest of the file.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from rlsched.cluster.errors import TraceError
from rlsched.traces.schema import json_name, json_problem, validate_trace

PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_SUFFIXES = (".jsonl", ".json")
#: Without a ``step`` column, a row group holds about this many whole trajectories.
TRAJECTORIES_PER_ROW_GROUP = 2048
_FORMAT_VERSION = "1"
DATA_DIR = Path(__file__).resolve().parent / "data"
SAMPLE_TRACE = "longtail-small"


def sample_trace_path(name: str = SAMPLE_TRACE) -> Path:
    """Path of a trace shipped in ``traces/data/`` (the default input of the CLI)."""
    path = DATA_DIR / f"{name}.parquet"
    if not path.exists():
        shipped = sorted(p.stem for p in DATA_DIR.glob("*.parquet"))
        raise TraceError(f"{path}: no shipped trace named {name!r} — expected one of "
                         f"{', '.join(shipped) or 'none (traces/data/ is empty)'}")
    return path


def _one_line(text: object) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= 160 else line[:157] + "..."


def _format_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    try:
        with path.open("rb") as fh:
            head = fh.read(64)
    except OSError as err:
        raise _unreadable(path, err) from None
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.lstrip()[:1] in (b"{", b"["):
        return "jsonl"
    raise TraceError(f"{path}: unknown trace format (suffix {suffix or 'none'!r}, content is "
                     f"neither Parquet nor JSON) — expected a .parquet or .jsonl file")


def _unreadable(path: Path, err: OSError | ValueError) -> TraceError:
    reason = err.strerror if isinstance(err, OSError) and err.strerror else _one_line(err)
    return TraceError(f"{path}: cannot read the file ({reason}) — expected a readable trace "
                      f"file (.parquet or .jsonl)")


def _check_file(path: Path) -> None:
    try:  # exists() itself raises for a name too long or a path with a NUL byte
        if not path.exists():
            raise TraceError(f"{path}: no such file — expected a trace file (.parquet or .jsonl)")
        if path.is_dir():
            raise TraceError(f"{path}: is a directory — expected a trace file (.parquet or .jsonl)")
        if path.stat().st_size == 0:
            raise TraceError(f"{path}: empty file — expected a Parquet or JSONL trace")
    except (OSError, ValueError) as err:
        raise _unreadable(path, err) from None


def _read_parquet(path: Path, steps: Iterable[int] | None,
                  tasks: Iterable[str] | None) -> pd.DataFrame:
    try:
        pf = pq.ParquetFile(path)
        filters = []
        if steps is not None:
            if "step" not in pf.schema_arrow.names:
                raise TraceError(f"{path}: column 'step' is missing — expected a step column "
                                 f"to load single steps")
            filters.append(("step", "in", [int(s) for s in steps]))
        if tasks is not None:
            filters.append(("task_id", "in", [str(t) for t in tasks]))
        table = pq.read_table(path, filters=filters) if filters else pf.read()
        # Arrow checks UTF-8 lazily; a damaged string page would otherwise fail later,
        # deep inside validation, with an ArrowException.
        table.validate(full=True)
    except TraceError:
        raise
    except (pa.ArrowException, OSError, ValueError) as err:
        raise TraceError(f"{path}: not a readable Parquet file ({_one_line(err)}) — expected "
                         f"an intact Parquet trace") from None
    try:
        try:
            return table.to_pandas()
        except (KeyError, IndexError, ValueError, TypeError):
            # Damaged pandas metadata (the "pandas" schema key): the columns may still be fine.
            return table.to_pandas(ignore_metadata=True)
    except (pa.ArrowException, ValueError, TypeError) as err:
        raise TraceError(f"{path}: Parquet columns cannot be read ({_one_line(err)}) — "
                         f"expected plain string, integer, float and boolean columns") from None


def _json_limit(path: Path, where: str, err: RecursionError | ValueError) -> TraceError:
    """The errors ``json`` raises outside JSONDecodeError: too deep, or too many digits."""
    if isinstance(err, RecursionError):
        what = "a JSON value nested too deeply to read"
    else:
        what = (f"a number too long to read (over {sys.get_int_max_str_digits()} digits)"
                if "digits" in str(err) else f"unreadable JSON ({_one_line(err)})")
    return TraceError(f"{path}: {where}{what} — expected one flat JSON object per turn")


def _read_jsonl(path: Path) -> tuple[pd.DataFrame, np.ndarray]:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise _unreadable(path, err) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise TraceError(f"{path}: line {line}: byte 0x{data[err.start]:02x} is not UTF-8 — "
                         f"expected UTF-8 text") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if text.lstrip().startswith("["):
        return _read_json_array(path, text)
    records: list[dict] = []
    lines: list[int] = []
    decoder = json.JSONDecoder()
    # JSON Lines ends lines with \n only (a \r before it is JSON whitespace); splitlines()
    # would also split at U+2028, U+0085, ... which may stand raw inside a JSON string.
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        try:
            obj = decoder.decode(raw)
        except json.JSONDecodeError as err:
            raise TraceError(f"{path}: line {number}: {json_problem(err)} at column {err.colno} — "
                             f"expected one JSON object per line") from None
        except (RecursionError, ValueError) as err:
            raise _json_limit(path, f"line {number}: ", err) from None
        if not isinstance(obj, dict):
            raise TraceError(f"{path}: line {number}: a JSON {json_name(obj)} — expected "
                             f"one JSON object per line") from None
        records.append(obj)
        lines.append(number)
    if not records:
        raise TraceError(f"{path}: no JSON lines — expected one JSON object per turn")
    return pd.DataFrame.from_records(records), np.asarray(lines, dtype=np.int64)


def _read_json_array(path: Path, text: str) -> tuple[pd.DataFrame, None]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise TraceError(f"{path}: line {err.lineno}: {json_problem(err)} at column {err.colno} — "
                         f"expected a JSON array of objects or JSON lines") from None
    except (RecursionError, ValueError) as err:
        raise _json_limit(path, "", err) from None
    if not obj or not all(isinstance(o, dict) for o in obj):
        raise TraceError(f"{path}: a JSON array that is empty or holds non-objects — expected "
                         f"one object per turn")
    return pd.DataFrame.from_records(obj), None


def load_trace(path: str | Path, *, steps: Iterable[int] | None = None,
               tasks: Iterable[str] | None = None) -> pd.DataFrame:
    """Read and validate a trace; return it in canonical form (see ``validate_trace``).

    The format follows the suffix (``.parquet``/``.pq`` or ``.jsonl``/``.json``); any other
    suffix is sniffed from the first bytes. ``steps`` and ``tasks`` (Parquet only) load just
    the rows of those RL steps / task ids, reading only the row groups whose column
    statistics can hold them (``write_trace`` makes one row group per step, or per block of
    whole trajectories in file order, so one step's tasks sit in one or two row groups).
    Forks must then stay within the loaded rows (they do: a fork is in its parent's task).
    """
    path = Path(path)
    _check_file(path)
    fmt = _format_of(path)
    if fmt == "parquet":
        df = _read_parquet(path, steps, tasks)
        lines = None
    else:
        if steps is not None or tasks is not None:
            raise TraceError(f"{path}: loading single steps or tasks needs a Parquet trace — "
                             f"expected a .parquet file")
        df, lines = _read_jsonl(path)
    return validate_trace(df, str(path), line_numbers=lines)


def _row_group_bounds(df: pd.DataFrame) -> list[tuple[int, int]]:
    """Row ranges, each one step or a block of whole trajectories (df is canonical)."""
    n = len(df)
    if "step" in df.columns:
        steps = df["step"].to_numpy(dtype=np.int64)
        cuts = np.flatnonzero(steps[1:] != steps[:-1]) + 1
    else:
        traj_start = np.flatnonzero(df["turn"].to_numpy() == 0)
        cuts = traj_start[TRAJECTORIES_PER_ROW_GROUP::TRAJECTORIES_PER_ROW_GROUP]
    edges = [0, *cuts.tolist(), n]
    return list(itertools.pairwise(edges))


def check_trace_out(path: Path, flag: str = "--out") -> None:
    """A trace file name the command line writes: Parquet or JSON Lines by its suffix
    (``trace gen --out g.csv`` wrote Parquet under a ``.csv`` name), and not a folder (an
    import of thousands of logs was read and counted before that was found)."""
    if path.suffix.lower() not in PARQUET_SUFFIXES + JSONL_SUFFIXES:
        raise TraceError(f"{flag} {path}: expected a trace file name ending in "
                         f"{', '.join(PARQUET_SUFFIXES + JSONL_SUFFIXES)}")
    if path.is_dir():  # (said by write_trace too, but only after the whole import or generation)
        raise TraceError(f"{path}: cannot write the trace (Is a directory) — expected a file path "
                         "that can be written")


def write_trace(df: pd.DataFrame, path: str | Path) -> Path:
    """Validate ``df`` and write it; Parquet unless the suffix is ``.jsonl``/``.json``.

    With a ``step`` column the rows are written step by step (stable, so trajectory order
    within a step is kept) and each step is one row group; otherwise each row group holds
    ``TRAJECTORIES_PER_ROW_GROUP`` whole trajectories. Returns the path written.
    """
    path = Path(path)
    df = validate_trace(df, str(path))
    if "step" in df.columns:
        steps = df["step"].to_numpy(dtype=np.int64)
        if np.any(steps[1:] < steps[:-1]):
            df = df.take(np.argsort(steps, kind="stable")).reset_index(drop=True)
    # Written beside the target and renamed into place: a write stopped part-way (Ctrl-C,
    # a full disk) left a valid Parquet file of the first row groups, a shorter trace that
    # nothing marked as one.
    part = path.with_name(f".{path.name}.part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            raise IsADirectoryError(21, "Is a directory")
        if path.suffix.lower() in JSONL_SUFFIXES:
            df.to_json(part, orient="records", lines=True, force_ascii=False)
        else:
            table = pa.Table.from_pandas(df, preserve_index=False)
            meta = dict(table.schema.metadata or {})
            meta[b"rlsched.trace_format"] = _FORMAT_VERSION.encode()
            table = table.replace_schema_metadata(meta)
            with pq.ParquetWriter(part, table.schema, compression="zstd", compression_level=9) as w:
                for lo, hi in _row_group_bounds(df):
                    w.write_table(table.slice(lo, hi - lo), row_group_size=max(hi - lo, 1))
        os.replace(part, path)
    except OSError as exc:  # a folder, a missing or read-only place: one line, no traceback
        _remove(part)
        raise TraceError(f"{path}: cannot write the trace ({exc.strerror or exc.__class__.__name__}) — expected a file path "
                         "that can be written") from None
    except BaseException:
        _remove(part)
        raise
    return path


def _remove(path: Path) -> None:
    """A partial file, if there is one (below a file or in a missing folder there is not)."""
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)
