"""Grading a coding task so that the agent can neither read the hidden tests nor forge the verdict.

Why split the tests: the agent's code must run to be tested, and whatever runs in a process
can write anything that process can write -- so a verdict computed next to the agent's code
(``assert`` in the same interpreter, a pass/fail line on a pipe) can be forged by a solution
written to do so, and an optimiser searching for reward will find one. Here the task's tests
are split at load time:

* the *calls* -- each test function with every ``assert`` replaced by a report of the value
  it would have checked -- go into a fresh grading sandbox with a copy of the agent's files;
* the *expectations* -- the literal each value is compared with, or whether it must be
  truthy or falsy -- never leave this process.

Inside the sandbox, ``hidden_tests_runner.py`` reports each value as the ``repr`` of plain
built-in data (exact types only: no object whose ``__eq__`` or ``__bool__`` the agent
wrote) on a pipe. Here each line is parsed as untrusted text (size-capped JSON, then
``ast.literal_eval``), and a test passes only if every one of its checks reported values
and all of them equal the hidden expectation, and the test ran to its end. The most a
forger can do is report values -- which is what solving the task is; it cannot learn the
expected ones, because they are not in the sandbox (and the task files are not mounted).

Supported asserts (others are refused when the task is loaded, so every shipped and user
task is gradable this way): ``assert EXPR == LITERAL``, ``assert EXPR`` and ``assert not
EXPR``, where ``EXPR`` is not itself a comparison or boolean operation (that would move
the decision back into the sandbox).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass

from rlsched.cluster.errors import ConfigError

CHECK_FUNCTION = "_rlsched_check"
_MAX_LINE = 16 << 10
_MAX_LINES = 10_000


@dataclass(frozen=True)
class Check:
    """One assert of a hidden test: ``kind`` is ``eq`` (value == expected), ``true`` or ``false``."""

    index: int
    test: str
    kind: str
    expected: object = None


@dataclass(frozen=True)
class GradingPlan:
    """What goes into the grading sandbox (``source``) and what stays here (``checks``)."""

    source: str
    checks: tuple[Check, ...]
    test_names: tuple[str, ...]


@dataclass(frozen=True)
class Verdict:
    passed: tuple[str, ...]
    failures: tuple[str, ...]  # "test_x: why", for the first lines of the observation


def _plain_literal(node: ast.expr) -> tuple[bool, object]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _refuse(where: str, node: ast.AST, why: str) -> ConfigError:
    return ConfigError(f"{where}: field 'tests' line {getattr(node, 'lineno', '?')}: {why}")


class _Split(ast.NodeTransformer):
    def __init__(self, where: str, test: str, checks: list[Check]) -> None:
        self.where, self.test, self.checks = where, test, checks

    def visit_Assert(self, node: ast.Assert) -> ast.stmt:
        expr, kind, expected = node.test, "true", None
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
            expr, kind = expr.operand, "false"
        elif isinstance(expr, ast.Compare):
            ok, value = (False, None)
            if len(expr.ops) == 1 and isinstance(expr.ops[0], ast.Eq):
                ok, value = _plain_literal(expr.comparators[0])
            if not ok:
                raise _refuse(
                    self.where, node, "only 'assert EXPR == LITERAL', 'assert EXPR' and 'assert not EXPR' can be "
                    "graded outside the sandbox (the expected side must be a literal)"
                )
            expr, kind, expected = expr.left, "eq", value
        double_not = isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not)
        if isinstance(expr, (ast.Compare, ast.BoolOp)) or double_not:
            raise _refuse(self.where, node, "the checked expression may not itself compare or combine values")
        index = len(self.checks)
        self.checks.append(Check(index, self.test, kind, expected))
        call = ast.Call(ast.Name(CHECK_FUNCTION, ast.Load()), [ast.Constant(index), expr], [])
        return ast.copy_location(ast.Expr(call), node)


def plan_tests(where: str, source: str) -> GradingPlan:
    """Split a task's test module into the sandbox's part and the expectations kept here."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise ConfigError(f"{where}: field 'tests' is not valid Python (line {err.lineno})") from None
    checks: list[Check] = []
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            before = len(checks)
            _Split(where, node.name, checks).visit(node)
            if len(checks) == before:
                raise _refuse(where, node, f"{node.name} has no assert, so it could not fail")
            names.append(node.name)
        elif any(isinstance(n, ast.Assert) for n in ast.walk(node)):
            raise _refuse(where, node, "asserts belong inside test_* functions")
    if not names:
        raise ConfigError(f"{where}: field 'tests' defines no top-level test_* function")
    return GradingPlan(ast.unparse(ast.fix_missing_locations(tree)), tuple(checks), tuple(names))


def _matches(check: Check, value: object) -> bool:
    if check.kind == "true":
        return bool(value)
    if check.kind == "false":
        return not bool(value)
    return value == check.expected and _same_shape(value, check.expected)


def _same_shape(a: object, b: object) -> bool:
    """Equal *and* of the same container kinds (a tuple does not pass for a list)."""
    if isinstance(a, (list, tuple, dict, set, frozenset)) or isinstance(b, (list, tuple, dict, set, frozenset)):
        if type(a) is not type(b):
            return False
        if isinstance(a, dict):
            return all(_same_shape(a[k], b[k]) for k in a)  # type: ignore[index]
        if isinstance(a, (list, tuple)):
            return all(_same_shape(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
    return True


def decide(plan: GradingPlan, report: str) -> Verdict:
    """The verdict from the runner's report (untrusted text): which tests passed, and why others failed."""
    values: dict[int, list[object]] = {}
    bad: dict[int, str] = {}
    errors: dict[str, str] = {}
    finished: set[str] = set()
    by_index = {c.index: c for c in plan.checks}
    for line in report.splitlines()[:_MAX_LINES]:
        if len(line) > _MAX_LINE or not line.startswith("{"):
            continue
        try:
            item = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(item, dict):
            continue
        kind = item.get("kind")
        if kind == "value" and type(item.get("check")) is int and type(item.get("repr")) is str:
            try:
                value = ast.literal_eval(item["repr"])
            except Exception:  # untrusted text: anything unparsable is a failed check
                bad.setdefault(item["check"], "unreadable value")
                continue
            values.setdefault(item["check"], []).append(value)
        elif kind == "bad" and type(item.get("check")) is int and type(item.get("why")) is str:
            bad.setdefault(item["check"], item["why"][:120])
        elif kind == "error" and type(item.get("test")) is str and type(item.get("why")) is str:
            errors.setdefault(item["test"], item["why"][:160])
        elif kind == "done" and type(item.get("test")) is str:
            finished.add(item["test"])
    passed: list[str] = []
    failures: list[str] = []
    for name in plan.test_names:
        why = errors.get(name)
        for check in (c for c in plan.checks if c.test == name):
            if why is not None:
                break
            got = values.get(check.index)
            if check.index in bad:
                why = f"check {check.index}: {bad[check.index]}"
            elif not got:
                why = f"check {check.index}: never reached"
            elif not all(_matches(by_index[check.index], v) for v in got):
                wrong = next(v for v in got if not _matches(check, v))
                why = f"check {check.index}: wrong value (got {repr(wrong)[:80]})"
        if why is None and name not in finished:
            why = "did not run to its end"
        if why is None:
            passed.append(name)
        else:
            failures.append(f"{name}: {why}")
    return Verdict(tuple(passed), tuple(failures))
