"""Whether runs shown side by side ran the same setup: trace, cluster and cost model.

A report of runs of different traces or clusters is not a comparison of policies: a policy
"wins" because its trace was shorter or its cluster larger. ``rlsched compare`` always
replays one setup, but ``rlsched report A B`` takes any run folders, so it says, in one
line, what differs (:func:`setup_differences`), on stderr and on the page. A run record's
``meta.json`` names its trace (``trace``, a path that may be relative to the run folder),
``num_gpus``, ``tp`` and ``cost_model``; a trace is the same when it is the same file or
a file with the same bytes (two copies of one trace are one setup).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

COST_KEYS_SHOWN = 3  # differing cost-model fields named in the line; the rest are counted


def resolve_trace(run_path: Path, given: Any) -> Path | None:
    """The trace file a run's ``meta["trace"]`` names, as found from here: the path as
    written, else relative to the run folder or its parent (a live record keeps the name
    only); None when it names none or none is readable."""
    if not isinstance(given, str) or not given:
        return None
    p = Path(given)
    for cand in (p, run_path / p, run_path.parent / p):
        if cand.is_file():
            return cand
    return None


def _digest(path: Path) -> str:
    st = path.stat()
    return _digest_of(str(path), st.st_size, st.st_mtime_ns)


@functools.cache
def _digest_of(path: str, size: int, mtime_ns: int) -> str:
    """A file's SHA-256, read once per version of the file: ``rlsched report`` asks for it
    twice (its stderr warning, then the page's note), and a trace may be gigabytes."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _trace_keys(runs: Sequence[tuple[Path, Mapping[str, Any]]]) -> list[str] | None:
    """One key per run, equal when the traces are the same (same file or same bytes);
    None when any run's trace is not readable from here (then only names are compared)."""
    files = [resolve_trace(path, meta.get("trace")) for path, meta in runs]
    if any(f is None for f in files):
        return None
    real = [str(f.resolve()) for f in files if f is not None]
    if len(set(real)) == 1:
        return real
    try:
        sizes = {r: Path(r).stat().st_size for r in set(real)}
        if len(set(sizes.values())) > 1:
            return [f"{r}:{sizes[r]}" for r in real]  # (different sizes: no need to read them)
        digests = {r: _digest(Path(r)) for r in set(real)}
    except OSError:
        return None
    return [digests[r] for r in real]


def _distinct(values: Sequence[Any]) -> str:
    """``16 vs 8``: the values in the order the runs were given, each once."""
    return " vs ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in dict.fromkeys(values))


def _trace_difference(runs: Sequence[tuple[Path, Mapping[str, Any]]]) -> str | None:
    names = [Path(str(meta.get("trace") or "?")).name for _, meta in runs]
    keys = _trace_keys(runs)
    if keys is None:
        return None if len(set(names)) == 1 else f"trace ({_distinct(names)})"
    if len(set(keys)) == 1:
        return None
    if len(set(names)) > 1:
        return f"trace ({_distinct(names)})"
    return f"trace ({names[0]}: files with different contents)"


def _cost_difference(runs: Sequence[tuple[Path, Mapping[str, Any]]]) -> str | None:
    costs = [meta.get("cost_model") for _, meta in runs]
    if not all(isinstance(c, dict) for c in costs):
        return None  # (a record without one, e.g. a live run: nothing to compare)
    keys = list(dict.fromkeys(k for c in costs for k in c))  # type: ignore[union-attr]
    differ = [k for k in keys if len({repr(c.get(k)) for c in costs}) > 1]  # type: ignore[union-attr]
    if not differ:
        return None
    shown = [f"{k} {_distinct([c.get(k) for c in costs])}" for k in differ[:COST_KEYS_SHOWN]]  # type: ignore[union-attr]
    more = len(differ) - COST_KEYS_SHOWN
    return "cost model (" + ", ".join(shown) + (f" and {more} more field(s)" if more > 0 else "") + ")"


def setup_differences(runs: Sequence[tuple[Path, Mapping[str, Any]]]) -> list[str]:
    """What differs between the runs' setups (``(run folder, meta)`` each): trace, GPUs,
    tp, cost model; empty when they ran the same one (or fewer than two runs)."""
    if len(runs) < 2:
        return []
    out = [_trace_difference(runs)]
    for key, label in (("num_gpus", "gpus"), ("tp", "tp")):
        values = [meta.get(key) for _, meta in runs]
        if len(set(map(repr, values))) > 1:
            out.append(f"{label} ({_distinct(values)})")
    out.append(_cost_difference(runs))
    return [d for d in out if d]


def differences_line(differences: Sequence[str]) -> str:
    """The warning, one line: what differs, and why it matters."""
    return (f"the runs compared differ in {'; '.join(differences)}: their numbers reflect the "
            "setup as well as the policy")
