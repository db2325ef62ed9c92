"""Running the fuzz properties and judging their outcomes (issue 9).

A :class:`FuzzProperty` is a strategy plus a check. The tests run each one with a small
example budget; ``bench/fuzz_profile.py`` runs the very same objects with a large one, so
CI and the long run cannot drift apart.

The verdict rules, shared by every check:

* a library entry point either returns, or raises the documented ``RlschedError`` subclass
  whose ``str()`` is one line; any other exception is a bug and fails the property;
* ``rlsched.cli.main`` returns 0, or returns 2 with exactly one non-empty stderr line that
  starts with ``rlsched: error:`` and no ``Traceback`` anywhere;
* a case marked ``must_fail=True`` must fail and ``must_fail=False`` must succeed.

``PENDING`` lists the tags of bug triggers already reported in modules this suite does not
own. Cases carrying them are skipped (``hypothesis.reject``) so CI stays green; each tag
also has a strict ``xfail`` regression test with the exact input, which starts passing --
and so fails strictly -- once the bug is fixed: then delete the tag here and the ``xfail``.
"""

from __future__ import annotations

import contextlib
import io
import signal
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fuzz_strategies import MISSING, TextCase
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from hypothesis.errors import UnsatisfiedAssumption

from rlsched.cluster.errors import RlschedError

#: Known bug triggers outside the fuzz suite's own files (reported to the lead).
PENDING: frozenset[str] = frozenset()  # the cost-* tags were fixed in sim/cost.py


#: Outcome label of a case skipped because it triggers a ``PENDING`` bug.
SKIPPED = "skipped (pending bug)"


class Hang(AssertionError):
    """A call ran past its time limit: a hang is as much a failure as a traceback."""


@contextlib.contextmanager
def time_limit(seconds: float, what: str) -> Iterator[None]:
    """Raise :class:`Hang` in the main thread after ``seconds`` (SIGALRM)."""

    def fire(signum: int, frame: object) -> None:
        raise Hang(f"{what}: still running after {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def skip_pending(tags: frozenset[str]) -> None:
    if tags & PENDING:
        reject()


# ---------------------------------------------------------------------------- library


def expect(call: Callable[[], Any], error: type[RlschedError], must_fail: bool | None,
           *, names: str | None = None) -> str:
    """Run a library entry point; return ``"ok"`` or ``"clean error"`` or fail.

    ``names``, when given, must appear in the message (the file the error is about).
    """
    try:
        call()
    except error as err:
        message = str(err)
        assert len(message.splitlines()) == 1 and "\n" not in message, \
            f"{type(err).__name__} message is not one line: {message!r}"
        assert message.strip(), f"empty {type(err).__name__} message"
        assert must_fail is not False, f"a valid input was rejected: {message}"
        if names is not None:
            assert names in message, f"message does not name {names!r}: {message}"
        return "clean error"
    assert must_fail is not True, "a clearly broken input was accepted"
    return "ok"


# --------------------------------------------------------------------------------- files


def materialize(case: TextCase, folder: Path, stem: str = "input") -> Path:
    """Create the case's file (or directory, or nothing) under ``folder``; return its path."""
    path = folder / f"{stem}{case.suffix}"
    if case.content is None:
        path.mkdir()
    elif case.content != MISSING:
        path.write_bytes(case.content)
    return path


# -------------------------------------------------------------------------------- CLI


@dataclass(frozen=True)
class CliResult:
    argv: tuple[str, ...]
    code: int
    out: str
    err: str
    shown_warnings: tuple[str, ...]


#: Categories Python prints by default; each would be one more line on a user's stderr.
_QUIET = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def run_cli(argv: Sequence[str], limit_s: float = 60.0) -> CliResult:
    """Call ``rlsched.cli.main`` in-process, capturing stdout/stderr and warnings.

    An exception escaping ``main`` propagates (it *is* the traceback a user would see).
    """
    from rlsched.cli import main

    out, err = io.StringIO(), io.StringIO()
    with warnings.catch_warnings(record=True) as caught, \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            time_limit(limit_s, f"rlsched {' '.join(argv)}"):
        warnings.simplefilter("always")
        code = main(list(argv))
    shown = tuple(f"{w.category.__name__}: {w.message}" for w in caught
                  if not issubclass(w.category, _QUIET))
    return CliResult(tuple(argv), code, out.getvalue(), err.getvalue(), shown)


def judge_cli(res: CliResult, must_fail: bool | None) -> str:
    """Apply the CLI verdict rules; return ``"ok"`` or ``"clean error"``."""
    assert "Traceback" not in res.out + res.err, f"traceback printed:\n{res.err}"
    if res.code == 0:
        assert must_fail is not True, f"a clearly broken input was accepted: {res.argv}"
        return "ok"
    lines = [line for line in res.err.splitlines() if line.strip()]
    assert res.code == 2, f"exit code {res.code}, stderr {res.err!r}"
    assert len(lines) == 1, f"stderr is not one line: {res.err!r}"
    assert lines[0].startswith("rlsched: error: "), f"not the project's error line: {lines[0]!r}"
    assert not res.shown_warnings, f"warnings would print extra lines: {res.shown_warnings}"
    assert must_fail is not False, f"a valid input was rejected: {lines[0]}"
    return "clean error"


def one_error(argv: Sequence[str]) -> str:
    """The one error line ``rlsched ARGV`` must end in (a clean error by the rules above)."""
    res = run_cli(argv)
    assert judge_cli(res, True) == "clean error"
    return res.err.strip()


def with_meta(run: Path, dest: Path, key: str, value: Any) -> Path:
    """A copy of the run record folder ``run`` at ``dest``, its ``meta.json`` field ``key``
    set to ``value`` (a record edited by hand, as a user might)."""
    import json
    import shutil

    shutil.copytree(run, dest)
    meta = json.loads((dest / "meta.json").read_text())
    meta[key] = value
    (dest / "meta.json").write_text(json.dumps(meta))
    return dest


def snapshot(path: Path) -> object:
    """What is at ``path``: nothing, a file's bytes, or a folder's files and their bytes."""
    if path.is_symlink() or path.is_file():
        return ("file", path.read_bytes())
    if path.is_dir():
        return ("dir", sorted((str(p.relative_to(path)), p.read_bytes() if p.is_file() else None)
                              for p in path.rglob("*")))
    return None


def leftovers(out: Path) -> list[str]:
    """Temporary siblings a compare may leave behind: ``.NAME.tmp-*``."""
    parent = out.absolute().parent
    return sorted(p.name for p in parent.glob(f".{out.name}.tmp-*")) if parent.is_dir() else []


def judge_compare(res: CliResult, must_fail: bool | None, out: Path, before: object) -> str:
    """The CLI rules plus: a failed compare leaves ``--out`` as it was and no temp folder;
    a successful one leaves ``summary.csv`` and no temp folder."""
    verdict = judge_cli(res, must_fail)
    assert not leftovers(out), f"temporary folders left behind: {leftovers(out)}"
    if verdict == "ok":
        assert (out / "summary.csv").is_file(), "compare succeeded without writing summary.csv"
    else:
        assert snapshot(out) == before, f"--out {out} changed by a failed compare"
    return verdict


# ---------------------------------------------------------------------------- running


@dataclass(frozen=True)
class FuzzProperty:
    """One property: ``check(case, folder)`` returns its outcome (``"ok"``, ``"clean
    error"``, or a more specific label) or raises. ``folder`` is a fresh empty directory,
    also the working directory, so nothing a check writes outlives the example."""

    name: str
    strategy: Callable[[], st.SearchStrategy]
    check: Callable[[Any, Path], str]
    ci_examples: int


@dataclass
class PropertyRun:
    name: str
    outcomes: Counter = field(default_factory=Counter)
    wall_s: float = 0.0
    failure: str | None = None

    @property
    def examples(self) -> int:
        """Cases judged (cases skipped as known bugs not counted)."""
        return sum(n for k, n in self.outcomes.items() if k != SKIPPED)


def run_property(prop: FuzzProperty, examples: int | None = None, *,
                 raise_failure: bool = True) -> PropertyRun:
    """Run ``prop`` for ``examples`` (default: its CI budget) generated cases."""
    result = PropertyRun(prop.name)

    @settings(max_examples=examples or prop.ci_examples, deadline=None, database=None,
              print_blob=True, suppress_health_check=list(HealthCheck))
    @given(prop.strategy())
    def property_holds(case: Any) -> None:
        with tempfile.TemporaryDirectory(prefix="rlsched-fuzz-") as tmp, contextlib.chdir(tmp):
            try:
                result.outcomes[prop.check(case, Path(tmp))] += 1
            except UnsatisfiedAssumption:
                result.outcomes[SKIPPED] += 1
                raise

    start = time.perf_counter()
    try:
        property_holds()
    except Exception as exc:  # the bench reports it; the tests re-raise it
        if raise_failure:
            raise
        notes = "\n".join(getattr(exc, "__notes__", []))
        result.failure = "".join(traceback.format_exception(exc)) + notes
    finally:
        result.wall_s = time.perf_counter() - start
    return result
