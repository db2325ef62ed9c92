"""The dependency rules of DESIGN.md, checked on the source: every import of every module.

``policies`` knows only ``cluster``; ``sim`` and ``real`` know ``cluster``, ``traces`` and the
policies they are handed (never the registry, never each other); ``analysis`` reads run
records and traces, never driver internals; torch, ray, vllm and megatron are imported only
in ``real``. The CLI package ``rlsched`` is the composition root and may import everything.
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
