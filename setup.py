"""Build hook: compile the simulator's inner loop with Cython when possible.

``sim/engine.py``, ``sim/traj.py``, ``sim/core.py`` and ``sim/turns.py`` are plain Python;
their ``.pxd`` files give Cython the C types. Built, a replay runs 2.5-2.8x faster (README,
"Simulator speed"); not built -- no Cython, no C compiler, or ``RLSCHED_PURE_PYTHON=1`` at
install -- the package installs and runs as pure Python with the same results
(tests/test_compiled.py compares the two). Everything else is in pyproject.toml.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

COMPILED = ("engine", "traj", "core", "turns")  # rlsched.sim modules, see rlsched/sim/__init__.py


class OptionalBuildExt(build_ext):
    """A failed compile leaves the pure-Python modules in charge instead of failing the install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # the compiler itself is missing or broken
            self._skip(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._skip(exc, ext.name)

    @staticmethod
    def _skip(exc: Exception, name: str = "the simulator's inner loop") -> None:
        print(f"rlsched: could not compile {name} ({exc}); it runs as pure Python "
              "(same results, 2.5-2.8x as slow)", file=sys.stderr)


def extensions() -> list[Extension]:
    if os.environ.get("RLSCHED_PURE_PYTHON"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("rlsched: Cython not found; the simulator runs as pure Python", file=sys.stderr)
        return []
    # Cython finds a module's .pxd (and resolves its cimports) by the module's package
    # path, so the sources are compiled from a copy laid out as rlsched/sim/ (the repo
    # maps the folder sim/ to rlsched.sim, see pyproject.toml).
    stage = Path("build") / "cython-src"
    pkg = stage / "rlsched" / "sim"
    pkg.mkdir(parents=True, exist_ok=True)
    for init in (stage / "rlsched" / "__init__.py", pkg / "__init__.py"):
        init.touch()
    for m in COMPILED:
        for suffix in (".py", ".pxd"):
            shutil.copy2(Path("sim") / f"{m}{suffix}", pkg / f"{m}{suffix}")
    exts = [
        Extension(f"rlsched.sim.{m}", [str(pkg / f"{m}.py")],
                  # no fused multiply-add: the C doubles must round as Python's floats do
                  extra_compile_args=["-O2", "-ffp-contract=off"])
        for m in COMPILED
    ]
    return cythonize(exts, quiet=True, compiler_directives={
        "language_level": 3,
        "annotation_typing": False,  # types come from the .pxd files only
        "embedsignature": True,
    })


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
