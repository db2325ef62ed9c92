"""The Cython build of the simulator's inner loop (setup.py, rlsched/sim/__init__.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rlsched.sim as simpkg

HERE = Path(__file__).resolve().parent


def _digest(pure: bool) -> dict:
    env = dict(os.environ)
    env.pop("RLSCHED_PURE_PYTHON", None)
    if pure:
        env["RLSCHED_PURE_PYTHON"] = "1"
    out = subprocess.run([sys.executable, str(HERE / "compiled_digest.py")], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


@pytest.mark.skipif(not simpkg.compiled(), reason="the inner loop is not compiled here "
                    "(no Cython build); .ci/run checks that CI builds it")
def test_compiled_build_reproduces_pure_python_exactly():
    """Same runs, same floats: every policy, with faults, under KV pressure."""
    compiled, pure = _digest(pure=False), _digest(pure=True)
    assert compiled["compiled"] == list(simpkg.COMPILED_MODULES)
    assert pure["compiled"] == []
    assert compiled["runs"].keys() == pure["runs"].keys()
    for key, run in pure["runs"].items():
        assert compiled["runs"][key] == run, key
    # the digest exercises the paths it is meant to: faults fired, elastic moved trajectories
    assert any(float.fromhex(r["faults"]["faults"]) > 0 for r in pure["runs"].values())
    assert any(r["migrated"] for r in pure["runs"].values())


def _fake_build(tmp_path: Path, monkeypatch, *, source_age: float, built=simpkg.COMPILED_MODULES):
    suffix = ".cpython-311-x86_64-linux-gnu.so"
    monkeypatch.setattr(simpkg, "_HERE", tmp_path)
    monkeypatch.setattr(simpkg, "EXTENSION_SUFFIXES", [suffix])
    for name in simpkg.COMPILED_MODULES:
        for ext in (".py", ".pxd"):
            (tmp_path / f"{name}{ext}").write_text("")
            os.utime(tmp_path / f"{name}{ext}", (1e9 + source_age, 1e9 + source_age))
        if name in built:
            (tmp_path / f"{name}{suffix}").write_text("")
            os.utime(tmp_path / f"{name}{suffix}", (1e9, 1e9))


def test_a_build_older_than_its_source_is_stale(tmp_path, monkeypatch):
    _fake_build(tmp_path, monkeypatch, source_age=60.0)  # edited a minute after the build
    assert simpkg._stale() == list(simpkg.COMPILED_MODULES)
    _fake_build(tmp_path, monkeypatch, source_age=-60.0)
    os.utime(tmp_path / "turns.pxd", (1e9 + 60, 1e9 + 60))  # only a .pxd changed
    assert simpkg._stale() == ["turns"]


def test_a_fresh_build_is_not_stale(tmp_path, monkeypatch):
    _fake_build(tmp_path, monkeypatch, source_age=1.0)  # a wheel install writes both at once
    assert simpkg._stale() == []
    assert [n for n in simpkg.COMPILED_MODULES if simpkg._built(n)] == list(simpkg.COMPILED_MODULES)


def test_pure_python_switch_runs_the_sources():
    code = "import rlsched.sim as s, rlsched.sim.turns as t; print(s.compiled(), t.__file__)"
    env = dict(os.environ, RLSCHED_PURE_PYTHON="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("()") and out.strip().endswith("turns.py")
