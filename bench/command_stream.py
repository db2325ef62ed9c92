"""A hash of every command a policy returns in a seed-scale replay: proof that a speed-up
changed no decision where ``bench/fingerprint.py``'s small runs may not reach.

Replays the swe-seed trace at the seed-scale preset of ``bench_scale.py`` (1024 GPUs, tp=4,
64 tasks x 8 samples a step) and hashes, for every event the policy sees, the time, the
event and the commands it returns (their ``repr``). Run it before and after a change that
must not alter behaviour; the ``stream`` hash must be equal. The hash is taken outside
the policy, so the run is slower than ``bench_scale.py``'s: do not time with it.

    python bench/command_stream.py --trace swe-seed.parquet --steps 12 \\
        --policies elastic,elastic:isolate=false
"""

from __future__ import annotations

import argparse
import hashlib
import time

from rlsched.cluster.config import RunConfig
from rlsched.policies import make_policy
from rlsched.sim.cost import CostModel
from rlsched.sim.run import simulate
from rlsched.sim.workload import replay_workload

SEED_GPUS, SEED_TP, TASKS_PER_STEP = 1024, 4, 64


def command_stream(spec: str, trace: str, steps: int) -> dict:
    workload, batches = replay_workload(trace, steps, TASKS_PER_STEP, stream_rows=0)
    policy = make_policy(spec)
    digest = hashlib.sha256()
    count = 0
    decide = policy.on_event

    def on_event(event, view):  # type: ignore[no-untyped-def]
        nonlocal count
        cmds = decide(event, view)
        digest.update(f"{view.now!r}|{event!r}|{list(cmds)!r}\n".encode())
        count += len(cmds)
        return cmds

    policy.on_event = on_event  # type: ignore[method-assign]
    start = time.perf_counter()
    out = simulate(workload, batches, policy, RunConfig(gpus=SEED_GPUS, tp=SEED_TP, steps=steps),
                   CostModel())
    return {"spec": spec, "steps": steps, "makespan": out.result.makespan,
            "events": out.result.events_processed, "commands": count,
            "stream": digest.hexdigest(), "wall_s": time.perf_counter() - start}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True, help="a swe-seed trace (rlsched trace gen --preset swe-seed)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--policies", default="elastic", help="comma-separated specs")
    args = ap.parse_args()
    for spec in args.policies.split(","):
        r = command_stream(spec, args.trace, args.steps)
        print(f"{r['spec']:<28} steps {r['steps']}  makespan {r['makespan']:.6f}  events {r['events']:,}  "
              f"commands {r['commands']:,}  stream {r['stream']}  ({r['wall_s']:.1f} s)")


if __name__ == "__main__":
    main()
