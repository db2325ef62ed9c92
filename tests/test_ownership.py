"""Who may write what (issue 22, item 3), checked on the source.

- The backends (``sim/backend.py``, ``real/loop/backend.py``) call only public methods of
  the drivers' parts: no ``x._name`` on anything but themselves.
- The simulator's collaborators (roles, training, faults, the backend) reach the rollout
  core only through its public fields and methods, and none of them is a mixin of it.
- A trajectory's placement fields (status, engine, pinning, dispatch/finish/training
  bookkeeping) are assigned only in ``cluster/state.py`` (``ClusterState``'s driver API):
  no driver module and not the driver loop writes them directly.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLACEMENT = {"status", "engine", "pinned", "migrations", "dispatches", "dispatch_time",
             "finish_time", "finish_status", "trained_version", "in_micro_batch"}


def _private_reaches(path: Path) -> list[str]:
    """``a.b._c``/``a._c`` where ``a`` is not ``self`` alone (``self._x`` is one's own)."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            bad.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    return bad


def _placement_writes(path: Path) -> list[str]:
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        flat: list[ast.expr] = []
        for t in targets:
            flat += list(t.elts) if isinstance(t, ast.Tuple) else [t]
        for t in flat:
            if isinstance(t, ast.Attribute) and t.attr in PLACEMENT:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} .{t.attr}")
    return bad


def test_backends_call_only_public_methods():
    bad = []
    for rel in ("sim/backend.py", "real/loop/backend.py"):
        bad += _private_reaches(ROOT / rel)
    assert bad == []


def test_sim_collaborators_use_the_cores_public_api():
    bad = []
    for rel in ("sim/roles.py", "sim/training.py", "sim/faults.py", "sim/driver.py"):
        bad += _private_reaches(ROOT / rel)
    assert bad == []


def test_the_simulator_is_composed_not_mixed_in():
    from rlsched.sim.core import DriverCore
    from rlsched.sim.driver import SimDriver
    from rlsched.sim.faults import Faults
    from rlsched.sim.roles import Roles
    from rlsched.sim.training import Training

    assert SimDriver.__bases__ == (object,)
    for part in (Roles, Training, Faults):
        assert not issubclass(part, DriverCore), part


def test_trajectory_placement_is_written_only_by_cluster_state():
    bad = []
    for part in ("sim", "real", "cluster"):
        for path in sorted((ROOT / part).rglob("*.py")):
            if path != ROOT / "cluster" / "state.py":
                bad += _placement_writes(path)
    assert bad == []


def test_the_checks_can_fail(tmp_path):
    (tmp_path / "x.py").write_text("def f(ts, d):\n    ts.status = 1\n    d.core._queue.append(1)\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert _placement_writes(tmp_path / "x.py") == ["x.py:2 .status"]
        assert _private_reaches(tmp_path / "x.py") == ["x.py:3 ._queue"]
    finally:
        ROOT = saved
