"""The trace schema (DESIGN.md "Traces") and its vectorised validator.

A trace is one row per turn. The column names below are a public contract: users, importers
and the live driver write them, so they never change meaning. Validation is done with whole
column operations (traces can hold tens of millions of rows) and, for every check, reports
the *first* offending row in file order, in one line::

    <file>: row <n>, column <col>: <value> — expected <what>

Rows are numbered from 1 in file order (the n-th data row; for JSONL the loader passes the
line numbers so messages say ``line <n>``).
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from rlsched.cluster.errors import TraceError
from rlsched.traces.structure import check_structure

TRACE_COLUMNS: tuple[str, ...] = (
    "task_id",
    "trajectory_id",
    "turn",
    "prompt_tokens",
    "output_tokens",
    "env_seconds",
)
OPTIONAL_COLUMNS: tuple[str, ...] = (
    "parent_trajectory_id",
    "branch_turn",
    "reward",
    "truncated",
    "step",
    "policy_version",
)

#: The most seconds of environment time one turn may take: about 32 years, longer than any
#: tool call (the fault schedule's bound, ``cluster.faults.MAX_SECONDS``). Past it the value
#: is damage or a stand-in for "never": 1.5e308 s summed to inf and the run "stalled at
#: t=infs" blaming the trainer's GPUs, and at 1e18 s the clock's resolution (128 s) swallowed
#: every decode and training time, so the figures were noise.
MAX_ENV_SECONDS = 1e9

_ID_COLUMNS = ("task_id", "trajectory_id")
_INT_COLUMNS = ("turn", "prompt_tokens", "output_tokens")
_NULLABLE_INT_COLUMNS = ("branch_turn", "step", "policy_version")


class _Where:
    """Turns positions in the frame into the row/line label a user can find in the file."""

    def __init__(self, source: str, line_numbers: np.ndarray | None) -> None:
        self.source = source
        self.lines = line_numbers

    def label(self, pos: int) -> str:
        if self.lines is not None:
            return f"line {int(self.lines[pos])}"
        return f"row {pos + 1}"

    def fail(self, pos: int, column: str, value: object, expected: str) -> TraceError:
        return TraceError(
            f"{self.source}: {self.label(pos)}, column {column}: {_show(value)} — expected {expected}"
        )


def json_name(value: object) -> str:
    """A parsed JSON value's kind for a message: its type's name, ``null`` for None (a
    message said "messages[0] is a JSON NoneType")."""
    return "null" if value is None else type(value).__name__


def json_problem(err: json.JSONDecodeError) -> str:
    """A JSON parse error's message, for a line that says where after it: Python's message
    for a cut string ends in "starting at" and left the line reading "Unterminated string
    starting at at column 16"."""
    return err.msg.removesuffix(" at")


def _show(value: object) -> str:
    """A short, one-line rendering of a cell value for an error message."""
    if isinstance(value, str):
        text = repr(value)
    elif value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        text = "missing value"
    else:
        text = repr(value.item() if isinstance(value, np.generic) else value)
    text = text.replace("\n", " ")
    return text if len(text) <= 60 else text[:57] + "..."


def _first(mask: np.ndarray) -> int | None:
    """Position of the first True in ``mask``, or None."""
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


def _check_columns(df: pd.DataFrame, source: str) -> None:
    present = [str(c) for c in df.columns]
    # Parquet (Arrow) allows two columns of one name; df[name] would then be a frame.
    dup = pd.Index(df.columns)
    dup = dup[dup.duplicated() & dup.isin([*TRACE_COLUMNS, *OPTIONAL_COLUMNS])]
    if len(dup):
        name = dup[0]
        raise TraceError(f"{source}: column {name!r} appears {present.count(str(name))} times — "
                         f"expected each column once")
    for col in TRACE_COLUMNS:
        if col in df.columns:
            continue
        unused = [c for c in present if c not in TRACE_COLUMNS and c not in OPTIONAL_COLUMNS]
        close = difflib.get_close_matches(col, unused, n=1, cutoff=0.6)
        hint = f" (found {close[0]!r}: misspelt?)" if close else ""
        raise TraceError(f"{source}: column {col!r} is missing{hint} — expected columns "
                         f"{', '.join(TRACE_COLUMNS)}")


def _is_null(values: pd.Series) -> np.ndarray:
    return values.isna().to_numpy(dtype=bool)


def _plain(s: pd.Series) -> pd.Series:
    """Categorical columns (dictionary-encoded Parquet) as plain object columns."""
    if isinstance(s.dtype, pd.CategoricalDtype):
        return pd.Series(s.to_numpy(dtype=object, na_value=None), index=s.index, name=s.name,
                         dtype=object)
    return s


def _ids(df: pd.DataFrame, col: str, where: _Where, *, nullable: bool) -> pd.Series:
    """A str (object) column; integers are accepted and turned into their decimal string."""
    s = _plain(df[col])
    null = _is_null(s)
    if not nullable and null.any():
        pos = _first(null)
        raise where.fail(pos, col, None, "a non-empty string id")
    if pd.api.types.is_string_dtype(s.dtype) and not pd.api.types.is_object_dtype(s.dtype):
        out = s.astype(object)
    elif pd.api.types.is_integer_dtype(s.dtype) and not pd.api.types.is_bool_dtype(s.dtype):
        out = s.astype("Int64").astype(str).astype(object)
    else:
        kinds = pd.api.types.infer_dtype(s, skipna=True)
        if kinds not in ("string", "empty", "integer", "mixed-integer"):
            ok = s.map(lambda v: isinstance(v, str) or (
                isinstance(v, int | np.integer) and not isinstance(v, bool | np.bool_))
            ).to_numpy(dtype=bool) | null
            pos = _first(~ok)
            if pos is not None:
                raise where.fail(pos, col, s.iloc[pos], "a string id")
        out = s if kinds in ("string", "empty") else s.map(
            lambda v: v if isinstance(v, str) or v is None else str(v))
    values = out.to_numpy(dtype=object, na_value=None, copy=True)
    values[null] = None
    empty = values == ""
    if nullable:
        values[empty] = None  # an empty parent id means "no parent"
    elif empty.any():
        raise where.fail(_first(empty), col, "", "a non-empty string id")
    return pd.Series(values, index=df.index, name=col, dtype=object)


def _to_float(v: object) -> float:
    """One cell as a float: missing is NaN, a whole number too big for a float is +-inf."""
    if v is None or v is pd.NA:
        return math.nan
    try:
        return float(v)  # type: ignore[arg-type]
    except OverflowError:  # a JSON integer with hundreds of digits
        return math.inf if v > 0 else -math.inf  # type: ignore[operator]


def _numbers(df: pd.DataFrame, col: str, where: _Where) -> np.ndarray:
    """Column as float64 for checking; fails on bools, strings and other non-numbers."""
    s = _plain(df[col])
    if pd.api.types.is_bool_dtype(s.dtype):
        raise where.fail(0, col, s.iloc[0], "a number, not a boolean")
    if pd.api.types.is_numeric_dtype(s.dtype):
        return s.to_numpy(dtype="float64", na_value=np.nan)
    bad = s.map(lambda v: isinstance(v, bool | np.bool_) or not (
        v is None or v is pd.NA or isinstance(v, int | float | np.integer | np.floating))
    ).to_numpy(dtype=bool)
    if bad.any():
        pos = _first(bad)
        raise where.fail(pos, col, s.iloc[pos], "a number")
    return np.fromiter((_to_float(v) for v in s), dtype="float64", count=len(s))


def _int_column(df: pd.DataFrame, col: str, where: _Where, *, nullable: bool,
                minimum: int | None) -> pd.Series:
    s = _plain(df[col])
    if pd.api.types.is_integer_dtype(s.dtype) and not pd.api.types.is_bool_dtype(s.dtype):
        null = _is_null(s)
        # The same bound as for floats below; uint64 is compared unsigned (no wrap-around).
        if pd.api.types.is_unsigned_integer_dtype(s.dtype):
            big = s.to_numpy(dtype="uint64", na_value=0) > 2**62
        else:
            big = np.abs(s.to_numpy(dtype="int64", na_value=0)) > 2**62
        if big.any():
            pos = _first(big)
            raise where.fail(pos, col, s.iloc[pos], "a whole number below 2**62")
        ints = s.to_numpy(dtype="int64", na_value=0)
    else:
        vals = _numbers(df, col, where)
        null = np.isnan(vals)
        bad = ~null & (~np.isfinite(vals) | (vals != np.round(vals)))
        if bad.any():
            pos = _first(bad)
            value = s.iloc[pos]
            whole = isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)
            raise where.fail(pos, col, value,
                             "a whole number below 2**62" if whole else "a whole number")
        big = ~null & (np.abs(vals) > 2.0**62)
        if big.any():
            pos = _first(big)
            raise where.fail(pos, col, s.iloc[pos], "a whole number below 2**62")
        ints = np.where(null, 0, vals).astype("int64")
    if not nullable and null.any():
        pos = _first(null)
        raise where.fail(pos, col, None, "a whole number >= 0")
    if minimum is not None:
        low = ~null & (ints < minimum)
        if low.any():
            pos = _first(low)
            raise where.fail(pos, col, s.iloc[pos], f"a whole number >= {minimum}")
    if nullable:
        return pd.Series(pd.arrays.IntegerArray(ints, null), index=df.index, name=col)
    return pd.Series(ints, index=df.index, name=col)


def _float_column(df: pd.DataFrame, col: str, where: _Where, *, allow_nan: bool) -> pd.Series:
    vals = _numbers(df, col, where)
    if allow_nan:
        bad = np.isinf(vals)
        what = "a finite number or missing"
    else:
        bad = ~np.isfinite(vals) | (vals < 0) | (vals > MAX_ENV_SECONDS)
        what = f"a finite number of seconds >= 0 and at most {MAX_ENV_SECONDS:g} (about 32 years)"
    if bad.any():
        pos = _first(bad)
        raise where.fail(pos, col, df[col].iloc[pos], what)
    return pd.Series(vals, index=df.index, name=col)


def _as_bool(v: object) -> bool | str | None:
    """One ``truncated`` cell: True/False, None when missing, ``"bad"`` otherwise."""
    if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return None
    if isinstance(v, bool | np.bool_):
        return bool(v)
    if isinstance(v, int | float | np.integer | np.floating) and v in (0, 1):
        return bool(v)
    return "bad"  # strings, other numbers, arrays (a Parquet list column), ...


def _bool_column(df: pd.DataFrame, col: str, where: _Where) -> pd.Series:
    """``truncated``: true/false (or 1/0); a missing value means False."""
    s = _plain(df[col])
    if pd.api.types.is_bool_dtype(s.dtype) and not _is_null(s).any():
        return s.astype(bool)
    vals = [_as_bool(v) for v in s.to_numpy(dtype=object)]
    bad = np.fromiter((v == "bad" for v in vals), dtype=bool, count=len(vals))
    if bad.any():
        pos = _first(bad)
        raise where.fail(pos, col, s.iloc[pos], "true or false")
    return pd.Series([v is True for v in vals], index=s.index, name=col, dtype=bool)


def validate_trace(df: pd.DataFrame, source: str, *,
                   line_numbers: Sequence[int] | np.ndarray | None = None) -> pd.DataFrame:
    """Check ``df`` against the schema and return it in canonical form.

    Canonical form: ids are Python ``str`` in object columns; ``turn``, ``prompt_tokens``,
    ``output_tokens`` int64; ``env_seconds`` and ``reward`` float64; ``branch_turn``,
    ``step``, ``policy_version`` nullable Int64; ``truncated`` bool;
    ``parent_trajectory_id`` str or None. Extra columns are kept unchanged. Rows are ordered
    trajectories by first appearance, turns ascending; the index is a fresh RangeIndex.

    ``source`` names the data in messages (usually the file path). ``line_numbers``, when
    given, maps each row to the line it came from (JSONL) so messages say ``line <n>``.
    Raises :class:`TraceError` with one line for the first problem found.
    """
    if not isinstance(df, pd.DataFrame):
        raise TraceError(f"{source}: got {type(df).__name__} — expected a pandas DataFrame")
    _check_columns(df, source)
    if len(df) == 0:
        raise TraceError(f"{source}: the trace has no rows — expected at least one turn")
    lines = None if line_numbers is None else np.asarray(line_numbers)
    where = _Where(source, lines)
    df = df.reset_index(drop=True)
    out = df.copy(deep=False)

    out["task_id"] = _ids(df, "task_id", where, nullable=False)
    out["trajectory_id"] = _ids(df, "trajectory_id", where, nullable=False)
    out["turn"] = _int_column(df, "turn", where, nullable=False, minimum=0)
    out["prompt_tokens"] = _int_column(df, "prompt_tokens", where, nullable=False, minimum=0)
    out["output_tokens"] = _int_column(df, "output_tokens", where, nullable=False, minimum=0)
    out["env_seconds"] = _float_column(df, "env_seconds", where, allow_nan=False)
    if "parent_trajectory_id" in df.columns:
        out["parent_trajectory_id"] = _ids(df, "parent_trajectory_id", where, nullable=True)
    for col in _NULLABLE_INT_COLUMNS:
        if col in df.columns:
            out[col] = _int_column(df, col, where, nullable=True, minimum=0)
    if "reward" in df.columns:
        out["reward"] = _float_column(df, "reward", where, allow_nan=True)
    if "truncated" in df.columns:
        out["truncated"] = _bool_column(df, "truncated", where)
    if "step" in out.columns and out["step"].isna().any():
        pos = _first(_is_null(out["step"]))
        raise where.fail(pos, "step", None, "a step number on every row (or no step column)")

    order = check_structure(out, where)
    out = out.take(order).reset_index(drop=True)
    return out
