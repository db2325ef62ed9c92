"""The dependency rules of DESIGN.md, checked on the source: every import of every module.

``policies`` knows only ``cluster``; ``sim`` and ``real`` know ``cluster``, ``traces`` and the
policies they are handed (never the registry, never each other); ``analysis`` reads run
records and traces, never driver internals; torch, ray, vllm and megatron are imported only
in ``real``. The CLI package ``rlsched`` is the composition root and may import everything;
its own layout (``cli/``, ``plan/``, ``config.py``) is checked below, and it has no import cycle.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("cluster", "policies", "traces", "sim", "real", "analysis")
HEAVY = ("torch", "ray", "vllm", "megatron")
# part -> the rlsched parts it may import (itself always allowed)
ALLOWED = {
    "cluster": set(),
    "policies": {"cluster"},
    "traces": {"cluster"},
    "sim": {"cluster", "traces"},
    "real": {"cluster", "traces"},
    "analysis": {"cluster", "traces"},
}


def _imports(path: Path, root: Path, part: str) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in ``path`` (relative ones resolved)."""
    pkg = ["rlsched", part, *path.relative_to(root / part).parent.parts]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
    return out


def _violations(part: str, root: Path = ROOT) -> list[str]:
    bad = []
    for path in sorted((root / part).rglob("*.py")):
        for line, mod in _imports(path, root, part):
            where = f"{path.relative_to(root)}:{line} imports {mod}"
            top = mod.split(".")[0]
            if top in HEAVY and part != "real":
                bad.append(where + " (heavy libraries only in real/)")
            if top != "rlsched":
                continue
            other = mod.split(".")[1] if mod.count(".") else ""
            if other == part:
                continue
            if other not in ALLOWED[part]:
                bad.append(where)
    return bad


@pytest.mark.parametrize("part", PARTS)
def test_dependencies_point_one_way(part):
    assert _violations(part) == []


def test_the_check_sees_a_violation(tmp_path):
    # the rule itself can fail: a sim module that imports the registry, real/ or torch
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "bad.py").write_text(
        "from rlsched.policies import make_policy\nfrom ..real import x\nimport torch\nfrom . import engine\n")
    assert [v.split(" imports ")[1] for v in _violations("sim", tmp_path)] == [
        "rlsched.policies", "rlsched.real", "torch (heavy libraries only in real/)"]


# ---------------------------------------------------------------- the composition root
def _module_of(path: Path, root: Path) -> list[str]:
    """The package path of ``path`` under ``root/rlsched`` (``rlsched/plan/checks.py`` ->
    ["rlsched", "plan", "checks"]; an ``__init__.py`` is its package)."""
    parts = ["rlsched", *path.relative_to(root / "rlsched").with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def _load_time_imports(path: Path, root: Path) -> set[str]:
    """Modules ``path`` imports when it loads (module level, ``TYPE_CHECKING`` blocks
    included; imports inside functions are left out: they run later)."""
    mod = _module_of(path, root)
    pkg = mod if path.name == "__init__.py" else mod[:-1]
    out: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = (".".join(pkg[: len(pkg) - node.level + 1]) if node.level else "")
                name = ".".join(x for x in (base, node.module or "") if x)
                out.add(name)
                out.update(f"{name}.{a.name}" for a in node.names)  # (a submodule, if it is one)
            for field in ("body", "orelse", "finalbody", "handlers"):
                visit([n for n in getattr(node, field, []) if isinstance(n, ast.stmt | ast.excepthandler)])

    visit(ast.parse(path.read_text()).body)
    return out


def _cycles(root: Path = ROOT) -> list[list[str]]:
    """Import cycles among the composition root's own modules (``rlsched/``)."""
    files = {".".join(_module_of(p, root)): p for p in sorted((root / "rlsched").rglob("*.py"))}
    graph = {m: sorted(i for i in _load_time_imports(p, root) if i in files and i != m)
             for m, p in files.items()}
    cycles, state = [], dict.fromkeys(graph, 0)  # 0 new, 1 on the path, 2 done

    def walk(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in graph[m]:
            if state[n] == 1:
                cycles.append([*path[path.index(n):], n])
            elif state[n] == 0:
                walk(n, [*path, n])
        state[m] = 2

    for m in graph:
        if state[m] == 0:
            walk(m, [m])
    return cycles


def test_composition_root_has_no_import_cycle():
    assert _cycles() == []


def test_the_cycle_check_sees_a_cycle(tmp_path):
    (tmp_path / "rlsched" / "plan").mkdir(parents=True)
    (tmp_path / "rlsched" / "plan" / "__init__.py").write_text("")
    (tmp_path / "rlsched" / "plan" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rlsched.plan.b import B\n")
    (tmp_path / "rlsched" / "plan" / "b.py").write_text("from .a import A\n")
    assert _cycles(tmp_path) == [["rlsched.plan.a", "rlsched.plan.b", "rlsched.plan.a"]]


def test_composition_root_layout():
    # one module per verb in rlsched/cli/, the planner in rlsched/plan/, trace variants in
    # traces/, config-file reading in rlsched/config.py (cluster/ reads no files)
    flat = sorted(p.name for p in (ROOT / "rlsched").glob("*.py")
                  if p.name.startswith(("cli", "plan")))
    assert flat == []
    verbs = {p.stem for p in (ROOT / "rlsched" / "cli").glob("*.py")}
    assert verbs >= {"__init__", "__main__", "run", "plan", "policy", "trace", "trace_import",
                     "report", "calibrate", "cost"}
    assert (ROOT / "rlsched" / "plan" / "__init__.py").exists()
    assert (ROOT / "traces" / "variants.py").exists()
    readers = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "cluster").rglob("*.py"))
               if {"tomllib", "tomli"} & {m.split(".")[0] for _, m in _imports(p, ROOT, "cluster")}]
    assert readers == []
