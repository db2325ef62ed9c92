"""Issue 9: the malformed-input fuzz properties with a large example budget.

Runs every property of ``tests/test_fuzz_trace.py``, ``tests/test_fuzz_config.py`` and
``tests/test_fuzz_cli.py`` -- the same ``FuzzProperty`` objects the tests run with a few
dozen examples each -- with ``--scale`` times their CI budget (default 20: about 11,700
cases), then prints per property: cases judged and their outcomes, cases skipped because
they trigger a bug already reported (``fuzz_kit.PENDING``), wall time, and any failure
with Hypothesis' minimal failing input and traceback. Exit code 1 if any property failed.

    python bench/fuzz_profile.py                  # ~10-15 min on one core
    python bench/fuzz_profile.py --scale 2        # a quick look
    python bench/fuzz_profile.py --only compare   # properties whose name contains "compare"
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import test_fuzz_cli
import test_fuzz_config
import test_fuzz_trace
from fuzz_kit import SKIPPED, PropertyRun, run_property

MODULES = (test_fuzz_trace, test_fuzz_config, test_fuzz_cli)


def _outcomes(run: PropertyRun) -> str:
    parts = [f"{n} {k}" for k, n in run.outcomes.most_common() if k != SKIPPED]
    return "; ".join(parts) or "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=20.0,
                    help="examples per property = scale x its CI budget (default 20)")
    ap.add_argument("--only", default="", help="run properties whose name contains this")
    args = ap.parse_args()
    props = [p for m in MODULES for p in m.PROPERTIES if args.only in p.name]
    runs: list[PropertyRun] = []
    start = time.perf_counter()
    for prop in props:
        n = max(1, round(prop.ci_examples * args.scale))
        run = run_property(prop, n, raise_failure=False)
        runs.append(run)
        status = "FAIL" if run.failure else "ok"
        print(f"[{status}] {prop.name}: {run.examples} judged (asked {n}), "
              f"{run.outcomes.get(SKIPPED, 0)} skipped as pending, {run.wall_s:.1f} s", flush=True)
        print(f"       outcomes: {_outcomes(run)}", flush=True)
    wall = time.perf_counter() - start
    total = sum(r.examples for r in runs)
    failed = [r for r in runs if r.failure]
    print(f"\n{len(runs)} properties, {total} cases judged, "
          f"{sum(r.outcomes.get(SKIPPED, 0) for r in runs)} skipped as pending, "
          f"{len(failed)} failed, {wall:.0f} s wall")
    for r in failed:
        print(f"\n===== FAILED: {r.name}\n{r.failure}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
