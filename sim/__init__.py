"""rlsched.sim: the SimPy simulator.

The inner loop (:mod:`.engine`, :mod:`.traj`, :mod:`.core`, :mod:`.turns`) is plain Python that the
package build compiles with Cython when it can (``setup.py``). This module decides which
of the two runs: the compiled modules, unless ``RLSCHED_PURE_PYTHON`` is set or a built
module is older than its source (an edit since the last ``pip install -e .``: running
the stale build would silently ignore it) or only some of them are built. The three are
switched together, because the compiled ones share C types.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

COMPILED_MODULES = ("engine", "traj", "core", "turns")  # in import order
_HERE = Path(__file__).resolve().parent
_SLACK_S = 2.0  # files a wheel install writes in one go can differ by this much


def _built(name: str) -> Path | None:
    for suffix in EXTENSION_SUFFIXES:
        p = _HERE / f"{name}{suffix}"
        if p.exists():
            return p
    return None


def _stale() -> list[str]:
    out = []
    for name in COMPILED_MODULES:
        so = _built(name)
        if so is None:
            continue
        newest = max((_HERE / f"{name}{s}").stat().st_mtime
                     for s in (".py", ".pxd") if (_HERE / f"{name}{s}").exists())
        if newest > so.stat().st_mtime + _SLACK_S:
            out.append(name)
    return out


def _load_sources() -> None:
    for name in COMPILED_MODULES:
        full = f"{__name__}.{name}"
        spec = importlib.util.spec_from_file_location(full, _HERE / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[full] = mod
        spec.loader.exec_module(mod)


_BUILT = [n for n in COMPILED_MODULES if _built(n)]
if _BUILT:
    _why = ""
    if os.environ.get("RLSCHED_PURE_PYTHON"):
        _why = "RLSCHED_PURE_PYTHON is set"
    elif len(_BUILT) < len(COMPILED_MODULES):
        _why = f"only {', '.join(_BUILT)} built (rebuild: pip install -e .)"
    elif _old := _stale():
        _why = f"stale build of {', '.join(_old)} (rebuild: pip install -e .)"
    if _why:
        if not _why.startswith("RLSCHED"):
            warnings.warn(f"rlsched.sim: {_why}; running the Python sources", stacklevel=1)
        _load_sources()


def compiled() -> tuple[str, ...]:
    """The inner-loop modules running as compiled extensions (empty: pure Python)."""
    mods = [importlib.import_module(f"{__name__}.{n}") for n in COMPILED_MODULES]
    return tuple(n for n, m in zip(COMPILED_MODULES, mods, strict=True)
                 if not str(m.__file__).endswith(".py"))
