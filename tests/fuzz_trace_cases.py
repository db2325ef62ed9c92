"""Hypothesis strategies for traces: valid-but-odd frames, frames with one clear schema
mistake, and trace files (Parquet, JSONL, JSON arrays) damaged at the byte level.

Valid traces are built trajectory by trajectory so they are valid by construction (turns
0..n-1, forks copy their parent's shared turns, ids unique), then their rows are shuffled.
Each mutation of :func:`broken_frames` breaks exactly one rule of DESIGN.md's schema in a
way no reading of the schema accepts, so the property can insist that it fails.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fuzz_strategies import MANY_DIGITS, MISSING, NOT_UTF8, TEXT_CHARS, TextCase, deep
from hypothesis import strategies as st

REQUIRED = ("task_id", "trajectory_id", "turn", "prompt_tokens", "output_tokens", "env_seconds")
ID_COLUMNS = ("task_id", "trajectory_id")
INT_COLUMNS = ("turn", "prompt_tokens", "output_tokens")

#: Ids: mostly short ASCII, sometimes any Unicode (spaces, U+2028, emoji, right-to-left).
IDS = st.one_of(st.text("abcxyz0123456789-_", min_size=1, max_size=6),
                st.text(TEXT_CHARS, min_size=1, max_size=6))


@dataclass(frozen=True)
class FrameCase:
    label: str
    df: pd.DataFrame
    must_fail: bool | None

    def __repr__(self) -> str:
        return f"FrameCase({self.label!r}, must_fail={self.must_fail},\n{self.df!r})"


# ----------------------------------------------------------------------------- valid


_OPTIONAL = st.sets(st.sampled_from(["reward", "truncated", "step", "policy_version", "extra"]))
_STEP_PER = st.sampled_from(["task", "trajectory"])
_SMALL = st.integers(0, 3)
_REWARD = st.one_of(st.floats(-10, 10), st.just(math.nan))
_EXTRA = st.text(TEXT_CHARS, max_size=4)


@st.composite
def valid_traces(draw, *, max_tasks: int = 3, max_trajs: int = 3, max_turns: int = 4,
                 max_tokens: int = 2048, max_env: float = 100.0) -> pd.DataFrame:
    """A small valid trace, optionally with forks and every optional column."""
    n_per_task = draw(st.lists(st.integers(1, max_trajs), min_size=1, max_size=max_tasks))
    tasks = draw(st.lists(IDS, min_size=len(n_per_task), max_size=len(n_per_task), unique=True))
    total = sum(n_per_task)
    trajs = iter(draw(st.lists(IDS, min_size=total, max_size=total, unique=True)))
    turns_of = st.integers(1, max_turns)
    numbers = st.tuples(st.integers(0, max_tokens), st.integers(0, max_tokens),
                        st.one_of(st.just(0.0), st.floats(0.0, max_env)))
    forks = draw(st.booleans())
    optional = draw(_OPTIONAL)
    step_per = draw(_STEP_PER)
    rows: list[dict] = []
    for task, n in zip(tasks, n_per_task, strict=True):
        made: list[tuple[str, list[dict]]] = []
        task_step = draw(_SMALL)
        for _ in range(n):
            tid = next(trajs)
            n_turns = draw(turns_of)
            parent, bt, parent_rows = None, None, []
            if forks and made and draw(st.booleans()):
                parent, parent_rows = made[draw(st.integers(0, len(made) - 1))]
                bt = draw(st.integers(0, min(n_turns, len(parent_rows))))
            values = draw(st.lists(numbers, min_size=n_turns, max_size=n_turns))
            common: dict = {"task_id": task, "trajectory_id": tid}
            if forks:
                common.update(parent_trajectory_id=parent, branch_turn=bt)
            if "reward" in optional:
                common["reward"] = draw(_REWARD)
            if "truncated" in optional:
                common["truncated"] = draw(st.booleans())
            if "step" in optional:
                common["step"] = task_step if step_per == "task" else draw(_SMALL)
            mine = []
            for turn, (p, o, env) in enumerate(values):
                if bt is not None and turn < bt:  # shared with the parent: same tokens
                    p, o = parent_rows[turn]["prompt_tokens"], parent_rows[turn]["output_tokens"]
                row = {**common, "turn": turn, "prompt_tokens": p, "output_tokens": o,
                       "env_seconds": env}
                if "policy_version" in optional:
                    row["policy_version"] = draw(_SMALL)
                if "extra" in optional:
                    row["extra"] = draw(_EXTRA)
                mine.append(row)
            made.append((tid, mine))
            rows.extend(mine)
    order = draw(st.permutations(range(len(rows))))
    return pd.DataFrame([rows[i] for i in order])


def odd_valid_traces() -> st.SearchStrategy[pd.DataFrame]:
    """Valid but at the edges: zero tokens, big counts, long environment waits."""
    return st.one_of(
        valid_traces(),
        valid_traces(max_tokens=0, max_env=0.0),
        valid_traces(max_tasks=1, max_trajs=1, max_turns=1),
        valid_traces(max_tokens=2**20, max_env=1e7),
    )


# ---------------------------------------------------------------------------- broken


def _set(df: pd.DataFrame, col: str, rows: list[int], value: object) -> pd.DataFrame:
    """Set cells by position; pandas re-infers the column's dtype as a reader would."""
    values = df[col].tolist() if col in df.columns else [None] * len(df)
    for r in rows:
        values[r] = value
    out = df.copy()
    out[col] = pd.Series(values, index=df.index, dtype=object).infer_objects()
    return out


def _rows_of(df: pd.DataFrame, tid: str) -> list[int]:
    return np.flatnonzero(df["trajectory_id"].to_numpy(dtype=object) == tid).tolist()


def _groups(df: pd.DataFrame) -> dict[str, list[str]]:
    first = df.drop_duplicates("trajectory_id")
    out: dict[str, list[str]] = {}
    for task, tid in zip(first["task_id"], first["trajectory_id"], strict=True):
        out.setdefault(task, []).append(tid)
    return out


def _link(df: pd.DataFrame, child: str, parent: object, bt: object) -> pd.DataFrame:
    rows = _rows_of(df, child)
    if "branch_turn" not in df.columns:
        df = _set(df, "branch_turn", [], None)
    if "parent_trajectory_id" not in df.columns:
        df = _set(df, "parent_trajectory_id", [], None)
    return _set(_set(df, "parent_trajectory_id", rows, parent), "branch_turn", rows, bt)


BAD_IDS = [None, "", 1.5, True, [1], {"a": 1}, math.nan]
BAD_INTS = [-1, -(10**6), 1.5, math.nan, math.inf, -math.inf, "7", True, None, 2**63, 10**30,
            [1], 2**62 + 1]
BAD_SECONDS = [-0.5, -1e-300, math.nan, math.inf, -math.inf, "1", True, None, [1.0]]
BAD_OPTIONAL = {"reward": [math.inf, -math.inf, "x", True], "truncated": [2, "yes", -1, 0.5],
                "policy_version": [-1, 1.5, "v", math.inf], "step": [-1, 2.5, "s"],
                "branch_turn": [-1, "x", 0.5]}


@st.composite
def broken_frames(draw) -> FrameCase:
    df = draw(valid_traces())
    n = len(df)
    row = draw(st.integers(0, n - 1))
    tid = df["trajectory_id"].iat[row]
    tids = df["trajectory_id"].drop_duplicates().tolist()
    groups = _groups(df)
    big = [g for g in groups.values() if len(g) >= 2]
    kind = draw(st.sampled_from([
        "bad cell", "drop column", "misspell column", "duplicate row", "turn gap",
        "turns start at 1", "trajectory in two tasks", "two trajectories share an id",
        "dangling parent", "branching cycle", "branch_turn without parent",
        "branch_turn column without parent column", "parent without branch_turn",
        "branch_turn too big", "shared turn differs", "parent in another task",
        "step missing on a row", "step varies in a trajectory", "bad optional value",
        "no rows", "duplicate column",
    ]))
    n_turns = len(_rows_of(df, tid))
    if kind == "drop column":
        out = df.drop(columns=[draw(st.sampled_from(REQUIRED))])
    elif kind == "misspell column":
        col = draw(st.sampled_from(REQUIRED))
        typos = {col + "s", col.upper(), col[:-1], col.replace("_", "-")} - {col}
        out = df.rename(columns={col: draw(st.sampled_from(sorted(typos)))})
    elif kind == "bad cell":
        col = draw(st.sampled_from(REQUIRED))
        pool = BAD_IDS if col in ID_COLUMNS else BAD_INTS if col in INT_COLUMNS else BAD_SECONDS
        value = draw(st.sampled_from(pool))
        kind = f"bad cell {col}={value!r}"
        out = _set(df, col, [row], value)
    elif kind == "duplicate row":
        out = pd.concat([df, df.iloc[[row]]], ignore_index=True)
    elif kind == "turn gap":
        out = _set(df, "turn", [row], n_turns + draw(st.integers(0, 3)))
    elif kind == "turns start at 1":
        rows = _rows_of(df, tid)
        out = df.copy()
        out.loc[out.index[rows], "turn"] = out["turn"].iloc[rows] + 1
    elif kind == "trajectory in two tasks":
        extra = df.iloc[[row]].copy()
        extra["turn"] = n_turns
        extra["task_id"] = "\x01other task " + "".join(map(str, df["task_id"].unique()))
        out = pd.concat([df, extra], ignore_index=True)
    elif kind == "two trajectories share an id" and len(tids) >= 2:
        a, b = draw(st.permutations(tids))[:2]
        out = _set(df, "trajectory_id", _rows_of(df, b), a)
    elif kind == "branching cycle":
        if big:
            a, b = draw(st.permutations(draw(st.sampled_from(big))))[:2]
            out = _link(_link(df, a, b, 0), b, a, 0)
        else:
            out = _link(df, tid, tid, 0)
    elif kind == "branch_turn without parent":
        out = _link(df, tid, None, 0)
    elif kind == "branch_turn column without parent column":
        out = _set(df.drop(columns=["parent_trajectory_id"], errors="ignore"), "branch_turn",
                   _rows_of(df, tid), 0)
    elif kind == "parent without branch_turn":
        out = _link(df, tid, draw(st.sampled_from(tids)), None)
    elif kind == "branch_turn too big":
        other = draw(st.sampled_from(groups[df["task_id"].iat[row]]))
        out = _link(df, tid, other, n_turns + len(_rows_of(df, other)) + 1)
    elif kind == "shared turn differs" and big:
        a, b = draw(st.permutations(draw(st.sampled_from(big))))[:2]
        out = _link(df, a, b, min(len(_rows_of(df, a)), len(_rows_of(df, b))))
        first_b = next(r for r in _rows_of(df, b) if df["turn"].iat[r] == 0)
        first_a = next(r for r in _rows_of(df, a) if df["turn"].iat[r] == 0)
        out = _set(out, "prompt_tokens", [first_a], int(df["prompt_tokens"].iat[first_b]) + 1)
    elif kind == "parent in another task" and len(groups) >= 2:
        mine = df["task_id"].iat[row]
        other_task = draw(st.sampled_from([t for t in groups if t != mine]))
        out = _link(df, tid, draw(st.sampled_from(groups[other_task])), 0)
    elif kind == "step missing on a row":
        out = _set(_with_steps(df), "step", [row], None)
    elif kind == "step varies in a trajectory" and n_turns >= 2:
        out = _with_steps(df)
        out = _set(out, "step", [row], int(out["step"].iat[row]) + 1)
    elif kind == "bad optional value":
        col = draw(st.sampled_from(sorted(BAD_OPTIONAL)))
        value = draw(st.sampled_from(BAD_OPTIONAL[col]))
        kind = f"bad optional {col}={value!r}"
        out = _set(df, col, [row], value)
    elif kind == "no rows":
        out = df.iloc[0:0]
    elif kind == "duplicate column":
        out = pd.concat([df, df[[draw(st.sampled_from(REQUIRED))]]], axis=1)
    else:  # the structure the mutation needs is missing: a dangling parent always works
        kind = "dangling parent"
        out = _link(df, tid, "\x02no such trajectory", 0)
    return FrameCase(kind, out.reset_index(drop=True), True)


def _with_steps(df: pd.DataFrame) -> pd.DataFrame:
    codes = pd.factorize(df["trajectory_id"])[0]
    out = df.copy()
    out["step"] = codes % 3
    return out


# ----------------------------------------------------------------------------- files


def _jsonable(v: object) -> object:
    if isinstance(v, np.generic):
        v = v.item()
    if v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    return v


def jsonl_bytes(df: pd.DataFrame, *, sparse: bool = False, crlf: bool = False,
                bom: bool = False, array: bool = False) -> bytes:
    """Rows as JSON lines (or one JSON array); ``sparse`` leaves out null fields."""
    records = []
    for rec in df.to_dict("records"):
        rec = {str(k): _jsonable(v) for k, v in rec.items()}
        if sparse:
            rec = {k: v for k, v in rec.items() if v is not None}
        records.append(rec)
    if array:
        text = json.dumps(records, ensure_ascii=False)
    else:
        sep = "\r\n" if crlf else "\n"
        text = sep.join(json.dumps(r, ensure_ascii=False) for r in records) + sep
    return ("\ufeff" if bom else "").encode() + text.encode("utf-8")


def parquet_bytes(table_or_df: pa.Table | pd.DataFrame, row_group_size: int | None = None) -> bytes:
    table = (table_or_df if isinstance(table_or_df, pa.Table)
             else pa.Table.from_pandas(table_or_df, preserve_index=False))
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=row_group_size)
    return buf.getvalue()


def frame_file(case: FrameCase, fmt: str) -> TextCase:
    """The frame as a file; Parquet falls back to JSONL when Arrow cannot type a column.

    JSON objects cannot hold two columns of one name (the reader keeps the last), so a
    frame with duplicate column names only keeps its verdict as Parquet.
    """
    if case.df.columns.duplicated().any():
        table = pa.Table.from_arrays([pa.array(case.df.iloc[:, k], from_pandas=True)
                                      for k in range(case.df.shape[1])],
                                     names=[str(c) for c in case.df.columns])
        return TextCase(f"parquet: {case.label}", ".parquet", parquet_bytes(table), case.must_fail)
    if fmt == "parquet":
        try:
            return TextCase(f"parquet: {case.label}", ".parquet", parquet_bytes(case.df),
                            case.must_fail)
        except (pa.ArrowException, ValueError, TypeError, OverflowError):
            fmt = "jsonl"
    return TextCase(f"{fmt}: {case.label}", ".json" if fmt == "json" else ".jsonl",
                    jsonl_bytes(case.df, array=fmt == "json"), case.must_fail)


def _arrow_variant(df: pd.DataFrame, kind: str) -> tuple[pa.Table, bool | None]:
    """Valid data in an unusual Arrow type (must load), or a type no trace column has."""
    table = pa.Table.from_pandas(df, preserve_index=False)
    i = table.schema.get_field_index
    if kind == "dictionary ids":
        col = "task_id"
        return table.set_column(i(col), col, pc.dictionary_encode(table[col])), False
    if kind == "dictionary ints":
        return table.set_column(i("turn"), "turn", pc.dictionary_encode(table["turn"])), False
    if kind == "large_string ids":
        return table.set_column(i("trajectory_id"), "trajectory_id",
                                table["trajectory_id"].cast(pa.large_string())), False
    if kind == "narrow ints":
        return table.set_column(i("turn"), "turn", table["turn"].cast(pa.int16())), False
    if kind == "float32 seconds":
        return table.set_column(i("env_seconds"), "env_seconds",
                                table["env_seconds"].cast(pa.float32())), False
    if kind == "nullable booleans":
        mask = pd.array([None if k % 2 else bool(k % 3) for k in range(len(df))], dtype="boolean")
        return pa.Table.from_pandas(df.assign(truncated=mask), preserve_index=False), False
    if kind == "list column":
        lists = pa.array([[v] for v in df["prompt_tokens"].tolist()])
        return table.set_column(i("prompt_tokens"), "prompt_tokens", lists), True
    if kind == "struct ids":
        structs = pa.array([{"id": v} for v in df["task_id"].tolist()])
        return table.set_column(i("task_id"), "task_id", structs), True
    if kind == "timestamp seconds":
        ts = pa.array(pd.to_datetime(df["env_seconds"], unit="s"))
        return table.set_column(i("env_seconds"), "env_seconds", ts), True
    if kind == "binary ids":
        raw = pa.array([str(v).encode() for v in df["task_id"].tolist()], type=pa.binary())
        return table.set_column(i("task_id"), "task_id", raw), None
    # two columns with one name: Arrow allows it, a trace cannot mean anything by it
    return table.append_column("turn", table["turn"]), True


ARROW_KINDS = ("dictionary ids", "dictionary ints", "large_string ids", "narrow ints",
               "float32 seconds", "nullable booleans", "list column", "struct ids",
               "timestamp seconds", "binary ids", "duplicate column name")


@st.composite
def trace_files(draw, *, valid: st.SearchStrategy[pd.DataFrame] | None = None) -> TextCase:
    """A trace file: valid, schema-broken, Arrow-typed oddly, or damaged byte by byte."""
    df = draw(valid if valid is not None else valid_traces())
    kind = draw(st.sampled_from([
        "valid", "broken frame", "valid jsonl variant", "arrow type", "truncated parquet",
        "flipped parquet bytes", "garbage", "empty", "not UTF-8", "line not an object",
        "bad JSON line", "deep nesting", "many digits", "huge number", "directory",
        "missing", "wrong suffix", "row groups",
    ]))
    pq_bytes = parquet_bytes(df)
    jl = jsonl_bytes(df)
    if kind == "valid":
        return frame_file(FrameCase("valid", df, False), draw(st.sampled_from(["parquet", "jsonl", "json"])))
    if kind == "broken frame":
        return frame_file(draw(broken_frames()), draw(st.sampled_from(["parquet", "jsonl", "json"])))
    if kind == "valid jsonl variant":
        opts = draw(st.fixed_dictionaries({"sparse": st.booleans(), "crlf": st.booleans(),
                                           "bom": st.booleans()}))
        blank = draw(st.booleans())
        data = jsonl_bytes(df, **opts)
        if blank:
            data = data.replace(b"\n", b"\n\n  \n")
        return TextCase(f"jsonl {opts} blank lines={blank}", ".jsonl", data, False)
    if kind == "arrow type":
        which = draw(st.sampled_from(ARROW_KINDS))
        table, verdict = _arrow_variant(df, which)
        return TextCase(f"parquet, {which}", ".parquet", parquet_bytes(table), verdict)
    if kind == "truncated parquet":
        cut = draw(st.integers(0, len(pq_bytes) - 1))
        return TextCase(f"parquet cut at {cut}/{len(pq_bytes)}", ".parquet", pq_bytes[:cut], True)
    if kind == "flipped parquet bytes":
        data = bytearray(pq_bytes)
        for at, b in draw(st.lists(st.tuples(st.integers(0, len(data) - 1), st.integers(0, 255)),
                                   min_size=1, max_size=4)):
            data[at] = b
        return TextCase("parquet with bytes replaced", ".parquet", bytes(data), None)
    if kind == "garbage":
        suffix = draw(st.sampled_from([".parquet", ".jsonl", ".json", ".pq", "", ".txt"]))
        return TextCase("garbage bytes", suffix, draw(st.binary(min_size=1, max_size=200)), True)
    if kind == "empty":
        return TextCase("empty file", draw(st.sampled_from([".parquet", ".jsonl", ""])),
                        draw(st.sampled_from([b"", b"\n", b"  \n\n", b"[]"])), True)
    if kind == "not UTF-8":
        at = draw(st.integers(0, len(jl)))
        return TextCase("jsonl with a non-UTF-8 byte", ".jsonl",
                        jl[:at] + draw(st.sampled_from(NOT_UTF8)) + jl[at:], True)
    if kind == "line not an object":
        junk = draw(st.sampled_from([b"[1, 2]", b"3", b'"row"', b"null", b"true"]))
        lines = jl.split(b"\n")
        lines.insert(draw(st.integers(0, len(lines) - 1)), junk)
        return TextCase("a JSON line that is not an object", ".jsonl", b"\n".join(lines), True)
    if kind == "bad JSON line":
        cut = draw(st.integers(0, len(jl) - 1))
        return TextCase(f"jsonl cut at {cut}", ".jsonl", jl[:cut], None)
    if kind == "deep nesting":
        where = draw(st.sampled_from(["line", "array"]))
        data = (b'{"task_id": ' + deep().encode() + b"}\n" if where == "line"
                else deep().encode())
        return TextCase(f"JSON nested 100000 deep ({where})", ".jsonl", data, True)
    if kind in ("many digits", "huge number"):
        col = draw(st.sampled_from(REQUIRED))
        digits = MANY_DIGITS if kind == "many digits" else "9" * 400
        lines = jl.split(b"\n")
        rec = json.loads(lines[0])
        rec[col] = 1234567
        lines[0] = json.dumps(rec, ensure_ascii=False).replace("1234567", digits, 1).encode()
        # ids may be whole numbers (turned into their decimal string): only those may load
        verdict = None if col in ID_COLUMNS and kind == "huge number" else True
        return TextCase(f"{kind} in {col}", ".jsonl", b"\n".join(lines), verdict)
    if kind == "directory":
        return TextCase("a directory", draw(st.sampled_from([".parquet", ".jsonl", ""])), None, True)
    if kind == "missing":
        return TextCase("no such file", ".parquet", MISSING, True)
    if kind == "wrong suffix":
        which = draw(st.sampled_from(["parquet as .dat", "jsonl as .txt", "parquet as .jsonl",
                                      "jsonl as .parquet"]))
        data = pq_bytes if which.startswith("parquet") else jl
        suffix = "." + which.rsplit(".", 1)[1]
        return TextCase(which, suffix, data, which in ("parquet as .jsonl", "jsonl as .parquet"))
    # row groups of one row each: a valid file that readers must stitch back together
    return TextCase("parquet, one row per row group", ".parquet", parquet_bytes(df, 1), False)
