"""Run the sandbox's half of a task's hidden tests and report each checked value as plain data.

Copied into a fresh grading sandbox with a copy of the agent's files and run there as
``python3 -I RUNNER TESTS_FILE`` (standard library only: the sandbox's python is the
host's, not the trainer's venv). ``TESTS_FILE`` is the task's tests with every ``assert``
replaced by a call ``_rlsched_check(index, value)`` (see ``grader.py``): this process
never sees what a value should be, so it decides nothing. It reports, one JSON object per
line on a duplicate of the original stdout (stdout and stderr are pointed at /dev/null
before any agent code is imported, so prints cannot fill the capped output):

* ``{"kind": "value", "check": i, "repr": "..."}`` -- the ``repr`` of a value made only of
  exact built-in types (int, float, complex, str, bytes, bool, None, and lists, tuples,
  dicts, sets of them); anything else is ``{"kind": "bad", ...}``;
* ``{"kind": "error", "test": name, "why": "..."}`` when a test raised;
* ``{"kind": "done", "test": name}`` when it ran to its end.

The agent's code runs in this process and can write anything here -- which is why the
grader treats every line as untrusted text and keeps the expectations to itself.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

_PLAIN = (int, float, complex, str, bytes, bool, type(None))
_CONTAINERS = (list, tuple, set, frozenset)


def _is_plain(value: object, depth: int = 0) -> bool:
    if depth > 50:
        return False
    if type(value) in _PLAIN:
        return True
    if type(value) in _CONTAINERS:
        return all(_is_plain(v, depth + 1) for v in value)  # type: ignore[attr-defined]
    if type(value) is dict:
        return all(_is_plain(k, depth + 1) and _is_plain(v, depth + 1) for k, v in value.items())  # type: ignore[attr-defined]
    return False


def main(tests_file: str) -> int:
    report = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.argv = [sys.argv[0]]
    sys.path.insert(0, os.getcwd())

    def emit(**item: object) -> None:
        report.write(json.dumps(item)[:16000] + "\n")

    def check(index: int, value: object) -> None:
        if _is_plain(value):
            emit(kind="value", check=index, repr=repr(value)[:15000])
        else:
            emit(kind="bad", check=index, why=f"not plain data ({type(value).__name__})")

    try:
        spec = importlib.util.spec_from_file_location("hidden_tests", tests_file)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        module._rlsched_check = check  # type: ignore[attr-defined]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except BaseException as err:
        emit(kind="error", test="*import*", why=f"{type(err).__name__}: {err}"[:300])
        return 1
    tests = [(n, f) for n, f in vars(module).items() if n.startswith("test_") and callable(f)]
    for name, func in tests:
        try:
            func()
        except BaseException as err:
            emit(kind="error", test=name, why=f"{type(err).__name__}: {err}"[:300])
        else:
            emit(kind="done", test=name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
