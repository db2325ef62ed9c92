"""Load the coding tasks shipped as TOML files in ``real/tasks/`` (or a user's folder).

One file per task, because a task is data a user can add without writing Python:

```toml
id = "fix-last-item"                       # unique; the trace's task_id
prompt = "Fix last() in utils.py ..."      # what the agent is asked to do
tests = '''                                # hidden tests: a Python module whose test_*
import utils                               # functions are run after SUBMIT (never shown;
                                           # asserts as grader.py allows: EXPR == LITERAL,
                                           # EXPR, not EXPR -- decided outside the sandbox)
def test_last(): assert utils.last([1, 2]) == 2
'''
[files]                                    # starter files the agent sees and edits
"utils.py" = '''...'''
[solution]                                 # a reference solution (files replacing starters);
"utils.py" = '''...'''                     # used by the test suite to prove the task solvable
```
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from rlsched.cluster.errors import ConfigError
from rlsched.real.envs.grader import GradingPlan, plan_tests
from rlsched.real.envs.sandbox import PathRefused, safe_relpath

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
_KEYS = {"id", "prompt", "tests", "files", "solution"}


@dataclass(frozen=True)
class CodingTask:
    task_id: str
    prompt: str
    files: dict[str, str]
    tests: str
    test_names: tuple[str, ...]
    solution: dict[str, str]
    source: str
    plan: GradingPlan  # the tests split into the sandbox's calls and the hidden expectations


def _files_table(path: Path, data: dict, key: str, *, required: bool) -> dict[str, str]:
    table = data.get(key, {})
    if not isinstance(table, dict) or (required and not table):
        raise ConfigError(f"{path}: field {key!r} must be a non-empty table of path = text")
    out: dict[str, str] = {}
    for name, text in table.items():
        if not isinstance(text, str):
            raise ConfigError(f"{path}: {key}.{name} must be a string, got {type(text).__name__}")
        try:
            out[safe_relpath(name)] = text
        except PathRefused as err:
            raise ConfigError(f"{path}: {key}.{name}: {err}") from None
    return out


def load_task(path: Path) -> CodingTask:
    """Parse and validate one task file; errors name the file and field."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read task file ({err})") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML ({err})") from None
    unknown = set(data) - _KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown field(s) {sorted(unknown)}; expected {sorted(_KEYS)}")
    for key in ("id", "prompt", "tests"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise ConfigError(f"{path}: field {key!r} must be a non-empty string")
    files = _files_table(path, data, "files", required=True)
    solution = _files_table(path, data, "solution", required=False)
    plan = plan_tests(str(path), data["tests"])
    return CodingTask(
        task_id=data["id"],
        prompt=data["prompt"].strip(),
        files=files,
        tests=data["tests"],
        test_names=plan.test_names,
        solution=solution,
        source=str(path),
        plan=plan,
    )


def load_tasks(directory: str | Path | None = None) -> dict[str, CodingTask]:
    """Every ``*.toml`` task in ``directory`` (default: the shipped tasks), by id."""
    folder = Path(directory) if directory is not None else TASKS_DIR
    paths = sorted(folder.glob("*.toml")) if folder.is_dir() else []
    if not paths:
        raise ConfigError(f"{folder}: no *.toml task files found")
    tasks: dict[str, CodingTask] = {}
    for path in paths:
        task = load_task(path)
        if task.task_id in tasks:
            raise ConfigError(
                f"{path}: task id {task.task_id!r} already defined in {tasks[task.task_id].source}"
            )
        tasks[task.task_id] = task
    return tasks
