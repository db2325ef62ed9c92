"""Issue 7: where a seed-scale replay spends its time, by part of the simulator.

Samples one policy's replay of the swe-seed trace (1024 GPUs, tp=4, 512 trajectories a
step) with py-spy, native frames included (the inner loop is compiled, so Python frames
alone would hide it), and prints the share of the event loop's samples that fall in each
part: SimPy's heap, the engines, the policy, the cluster view, role changes, training,
and writing the run record. Shares overlap where one part calls another (the policy's
commands change roles). py-spy is not a dependency of rlsched: install it beside it.

    .venv/bin/pip install py-spy
    python bench/profile_scale.py --policy elastic --steps 16 [--trace swe-seed.parquet]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PARTS = (
    ("SimPy's event heap (heapq)", r"_heapq"),
    ("engines (sim/engine.py)", r"sim/engine\.py"),
    ("policy (on_event)", r"\.on_event \("),
    ("cluster view and state (cluster/state.py, view.py)", r"cluster/(state|view)\.py"),
    ("role changes (sim/roles.py)", r"sim/roles\.py"),
    ("training (sim/trainer.py, training.py)", r"sim/train"),
    ("run record (RunRecorder: buffers, Parquet)", r"RunRecorder\."),
)

CHILD = """
import sys, tempfile
from pathlib import Path
from rlsched.cluster.config import RunConfig
from rlsched.policies import make_policy
from rlsched.sim.cost import CostModel
from rlsched.sim.run import simulate
from rlsched.sim.workload import replay_workload
spec, trace, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
w, batches = replay_workload(trace, steps, 64, stream_rows=0)
with tempfile.TemporaryDirectory() as d:
    simulate(w, batches, make_policy(spec), RunConfig(gpus=1024, tp=4, steps=steps), CostModel(),
             out_dir=Path(d) / "run")
"""


def shares(raw: Path) -> tuple[int, int, list[tuple[str, float]]]:
    """(samples in simulate(), samples in its event loop, [(part, % of the loop)])."""
    stacks = []
    for line in raw.read_text().splitlines():
        if line.strip():
            frames, n = line.rsplit(" ", 1)
            stacks.append((frames.split(";"), int(n)))
    in_sim = [(s, n) for s, n in stacks if any("simulate (" in f and "run.py" in f for f in s)]
    in_loop = [(s, n) for s, n in in_sim if any(re.search(r"\brun \(.*driver\.py", f) for f in s)]
    loop = sum(n for _, n in in_loop) or 1
    out = [(name, 100.0 * sum(n for s, n in in_loop if any(re.search(pat, f) for f in s)) / loop)
           for name, pat in PARTS]
    return sum(n for _, n in in_sim), loop, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="elastic")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--trace", type=Path, default=None, help="an existing swe-seed trace")
    ap.add_argument("--rate", type=int, default=200, help="samples per second")
    a = ap.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        print("profile_scale: py-spy is not installed (pip install py-spy)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as d:
        trace = a.trace
        if trace is None:
            trace = Path(d) / "swe-seed.parquet"
            subprocess.run([sys.executable, "-c", "import sys; from rlsched.cli import main; sys.exit(main())",
                            "trace", "gen", "--preset", "swe-seed", "--seed", "0", "--out", str(trace)],
                           check=True, stdout=subprocess.DEVNULL)
        raw = Path(d) / "profile.raw"
        subprocess.run([spy, "record", "--native", "-r", str(a.rate), "-f", "raw", "-o", str(raw), "--",
                        sys.executable, "-c", CHILD, a.policy, str(trace), str(a.steps)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        in_sim, loop, parts = shares(raw)
    print(f"## py-spy: {a.policy}, swe-seed, 1024 GPUs, {a.steps} steps "
          f"({in_sim} samples in simulate(), {loop} in its event loop)\n")
    print("| part | share of the event loop |")
    print("|---|---:|")
    for name, pct in parts:
        print(f"| {name} | {pct:.1f}% |")
    print(f"\nafter the loop (lower bound, closing the record): {100 * (in_sim - loop) / max(1, in_sim):.1f}% "
          "of simulate(); the rest of the loop is the turns' own code (sim/turns.py, sim/core.py).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
