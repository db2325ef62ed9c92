"""Whether runs shown side by side ran the same setup: trace, cluster and cost model.

A report of runs of different traces or clusters is not a comparison of policies: a policy
"wins" because its trace was shorter or its cluster larger. ``rlsched compare`` always
replays one setup, but ``rlsched report A B`` takes any run folders, so it says, in one
line, what differs (:func:`setup_differences`, :func:`setup_warning`), on stderr and on the
page. A run record's ``meta.json`` names its trace (``trace``, a path that may be relative
to the run folder), ``num_gpus``, ``tp`` and ``cost_model``; a trace is the same when it is
the same file or a file with the same bytes (two copies of one trace are one setup).

A record also holds the SHA-256 and size of the trace file it replayed
(``trace_sha256``, ``trace_bytes``: :mod:`rlsched.traces.digest`). Where the runs have
them, the traces compared are the ones the runs replayed, not the files now on disk: two
runs of one path whose file was replaced in between differ, and a file changed since a
run is named. Records without them are compared by the files now on disk, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlsched.traces.digest import TRACE_RESOLVED, FileDigest, file_digest, recorded_digest

COST_KEYS_SHOWN = 3  # differing cost-model fields named in the line; the rest are counted

Runs = Sequence[tuple[Path, Mapping[str, Any]]]


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


def run_trace(run_path: Path, meta: Mapping[str, Any]) -> Path | None:
    """The trace file a run replayed, as found from here: :func:`resolve_trace` on its
    ``trace``, then the absolute path the run resolved it to (``trace_resolved``: a
    relative ``--trace`` named a file in the folder the run was started from, which a
    report started elsewhere could not find, or found another file of that name there).
    When the run recorded its trace's digest, a candidate holding other bytes gives way to
    one holding the recorded ones; with none, the first found (its change is then said,
    :func:`trace_changed`)."""
    found: list[Path] = []
    given = meta.get("trace")
    first = resolve_trace(run_path, given)
    if first is not None:
        found.append(first)
    resolved = meta.get(TRACE_RESOLVED)
    if isinstance(resolved, str) and resolved and Path(resolved).is_file() and not (
            first is not None and first.resolve() == Path(resolved).resolve()):
        found.append(Path(resolved))  # (one file found both ways is one candidate: no hashing)
    recorded = recorded_digest(meta)
    if recorded is None or len(found) < 2:
        return found[0] if found else None
    for f in found:
        try:
            if f.stat().st_size == recorded.size and file_digest(f) == recorded:
                return f
        except OSError:
            continue
    return found[0]


def _digest(path: Path) -> str:
    return file_digest(path).sha256


def _file_keys(files: Sequence[Path | None]) -> list[str] | None:
    """Records without a recorded digest: one key per run from the file now on disk, equal
    when the traces are the same (same file or same bytes); None when any is not readable
    from here (then only names are compared)."""
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


def _trace_keys(files: Sequence[Path | None], recorded: Sequence[FileDigest | None]) -> list[str] | None:
    """One key per run, equal when the runs replayed the same bytes: the recorded digest
    where a run has one, else the digest of its file now on disk; records without any
    recorded digest are compared exactly as before (:func:`_file_keys`)."""
    if all(r is None for r in recorded):
        return _file_keys(files)
    keys = []
    for f, r in zip(files, recorded, strict=True):
        if r is not None:
            keys.append(r.sha256)
            continue
        if f is None:
            return None
        try:
            keys.append(_digest(f))
        except OSError:
            return None
    return keys


def _distinct(values: Sequence[Any]) -> str:
    """``16 vs 8``: the values in the order the runs were given, each once."""
    return " vs ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in dict.fromkeys(values))


def _one_path(runs: Runs, files: Sequence[Path | None]) -> bool:
    """Whether every run names the same trace file (not merely files of one name): the
    same file as found from here, or, where one is not found, one absolute path (a relative
    one may have been read from different folders)."""
    if all(f is not None for f in files):
        return len({str(f.resolve()) for f in files if f is not None}) == 1
    given = {str(meta.get("trace")) for _, meta in runs}
    return len(given) == 1 and Path(given.pop()).is_absolute()


def _trace_difference(runs: Runs) -> str | None:
    names = [Path(str(meta.get("trace") or "?")).name for _, meta in runs]
    files = [run_trace(path, meta) for path, meta in runs]
    recorded = [recorded_digest(meta) for _, meta in runs]
    keys = _trace_keys(files, recorded)
    if keys is None:
        return None if len(set(names)) == 1 else f"trace ({_distinct(names)})"
    if len(set(keys)) == 1:
        return None
    if len(set(names)) > 1:
        return f"trace ({_distinct(names)})"
    if all(r is not None for r in recorded) and _one_path(runs, files):
        shas = _distinct([r.short() for r in recorded if r is not None])
        return f"trace ({names[0]}: replaced between the runs; SHA-256 {shas})"
    return f"trace ({names[0]}: files with different contents)"


def trace_changed(runs: Runs) -> str | None:
    """Which runs replayed a trace file other than the one now at its path, from the
    digests they recorded (any number of runs); None when none did, or none recorded one.
    The report's trace statistics are of the file now, so this is said even of one run.
    A file of another size is known to differ without reading it; one of the recorded
    size is hashed once (:func:`~rlsched.traces.digest.file_digest`)."""
    changed: dict[str, list[tuple[str, FileDigest]]] = {}  # trace file -> [(run, recorded)]
    now: dict[str, FileDigest] = {}  # trace file -> what it holds now (sha256 "" until needed)
    for path, meta in runs:
        r = recorded_digest(meta)
        f = run_trace(path, meta) if r is not None else None
        if r is None or f is None:
            continue
        key = str(f.resolve())
        try:
            d = now.get(key) or FileDigest("", f.stat().st_size)
            if d.size == r.size and not d.sha256:
                d = file_digest(f)
        except OSError:
            continue
        now[key] = d
        if d.size != r.size or d.sha256 != r.sha256:
            changed.setdefault(key, []).append((str(path), r))
    if not changed:
        return None
    notes = []
    for key, hits in changed.items():
        d = now[key]
        then = _distinct([r.short() for _, r in hits])
        who = "the runs" if len(hits) == len(runs) > 1 else ", ".join(p for p, _ in hits)
        current = f"SHA-256 {d.short()}" if d.sha256 else f"{d.size:,} bytes"
        notes.append(f"{Path(key).name} on disk now ({current}) is not the file {who} replayed (SHA-256 {then})")
    return "; ".join(notes)


def _cost_difference(runs: Runs) -> str | None:
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


def setup_differences(runs: Runs) -> list[str]:
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


def setup_warning(runs: Runs) -> str | None:
    """The one warning line for runs shown together (stderr and the report page): what
    differs between their setups (:func:`setup_differences`), then any trace file changed
    since a run replayed it (:func:`trace_changed`); None when there is nothing to say."""
    differences = setup_differences(runs)
    changed = trace_changed(runs)
    if differences:
        return differences_line(differences) + (f"; {changed}" if changed else "")
    if changed:
        return f"{changed}: the report's trace statistics are of the file now, not of the one replayed"
    return None
