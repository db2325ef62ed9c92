"""Run a task's hidden tests inside the sandbox and report each result on a private fd.

Copied into the evaluation directory and run there as
``python3 -I RUNNER TESTS_FILE MARKER`` (standard library only: the sandbox's python is
the host's, not the trainer's venv). Before any agent code is imported, stdout and stderr
are pointed at /dev/null and the results go to a duplicate of the original stdout, each
line prefixed with ``MARKER`` (a random string chosen per evaluation), so prints from the
agent's code can neither fill the capped output nor be mistaken for results by accident.
This is not proof against a solution written to forge results on purpose (it runs in the
same process); the sandbox bounds what such code can do, not what it can claim.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def main(tests_file: str, marker: str) -> int:
    report = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.argv = [sys.argv[0]]
    sys.path.insert(0, os.getcwd())

    def emit(kind: str, name: str, detail: str = "") -> None:
        line = f"{marker} {kind} {name} {detail}".replace("\n", " ")
        report.write(line[:300] + "\n")

    try:
        spec = importlib.util.spec_from_file_location("hidden_tests", tests_file)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except BaseException as err:
        emit("error", "import", f"{type(err).__name__}: {err}")
        return 1
    tests = [(n, f) for n, f in vars(module).items() if n.startswith("test_") and callable(f)]
    for name, func in tests:
        try:
            func()
        except BaseException as err:
            emit("fail", name, f"{type(err).__name__}: {err}")
        else:
            emit("pass", name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
