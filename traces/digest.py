"""A trace file's identity as a run record keeps it: its SHA-256 and its size in bytes.

Why: a run record names its trace by path, and a path says nothing of the bytes behind it.
A trace replaced in place after a run made two runs "of one trace" look like one setup in
``rlsched report A B``. So each driver records the digest of the file it replayed
(``meta.json``: :data:`TRACE_SHA256`, :data:`TRACE_BYTES`) and the analysis compares those
(:mod:`rlsched.analysis.comparable`); records written before these keys keep working as
they did, compared by the files now on disk.

A trace may be gigabytes, so a file's digest is read once per version of the file (its
real path, size and modification time) in a process: ``rlsched compare`` records it for
every policy's run, and the report asks again for its warning and its page.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlsched.cluster.errors import TraceError

#: ``meta.json`` keys: the replayed trace file's SHA-256 (64 lowercase hex digits) and size.
TRACE_SHA256 = "trace_sha256"
TRACE_BYTES = "trace_bytes"
#: ``meta.json`` key: the absolute path the run's ``trace`` named when it ran (``trace`` is
#: kept as given, often relative to the folder the run was started from).
TRACE_RESOLVED = "trace_resolved"

_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class FileDigest:
    """What a file held: its SHA-256 (hex) and its size in bytes."""

    sha256: str
    size: int

    def short(self) -> str:
        """The first 8 hex digits: enough to tell two versions apart in a message."""
        return self.sha256[:8]


def file_digest(path: str | Path, *, cached: bool = True) -> FileDigest:
    """The file's digest, read once per version of the file (see the module doc);
    ``cached=False`` reads it again (a writer that has just rewritten the file: two
    versions of one size written within one tick of the file system's clock would share
    a cache key). Raises ``OSError`` as ``open`` does."""
    real = os.path.realpath(path)
    st = os.stat(real)
    if not cached:
        return FileDigest(_sha256(real), st.st_size)
    return FileDigest(_sha256_cached(real, st.st_size, st.st_mtime_ns), st.st_size)


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@functools.cache
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    """(``size`` and ``mtime_ns`` are the cache key: a file rewritten since is read again.)"""
    return _sha256(path)


def trace_meta(path: str | Path, *, cached: bool = True) -> dict[str, Any]:
    """The ``meta.json`` keys that pin the trace at ``path`` to the bytes a run replayed
    (``cached`` as for :func:`file_digest`); :class:`TraceError` (one line) when the file
    cannot be read."""
    try:
        d = file_digest(path, cached=cached)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace to record its SHA-256 "
                         f"({exc.strerror or type(exc).__name__})") from None
    return {TRACE_SHA256: d.sha256, TRACE_BYTES: d.size}


def trace_location(path: str | Path) -> dict[str, str]:
    """The ``meta.json`` keys that say where a run's trace is: ``trace`` as given (a public
    field, often relative to the folder the run started in) and :data:`TRACE_RESOLVED`, its
    absolute path, so a report started elsewhere finds it."""
    return {"trace": str(path), TRACE_RESOLVED: str(Path(path).resolve())}


def recorded_digest(meta: Mapping[str, Any]) -> FileDigest | None:
    """The trace digest a run record holds; None for a record without one (written before
    the keys existed, or a live run that recorded no trace) or with a malformed one (which
    :func:`rlsched.analysis.load.check_meta` refuses when the record is loaded)."""
    sha, size = meta.get(TRACE_SHA256), meta.get(TRACE_BYTES)
    if not is_sha256(sha):
        return None
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        return None
    return FileDigest(sha, size)


def is_sha256(value: Any) -> bool:
    """A SHA-256 as :data:`TRACE_SHA256` holds it: 64 lowercase hex digits."""
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None
