"""A bare SimPy loop over the same trajectories and turns as a simulator run: the floor
the simulator is measured against (issue 7).

One process per trajectory, two timeouts per turn (its generation, then its tool time),
no engines, no policy, no bookkeeping. Steps run one after another (each step's
processes start when the previous step's are done), so the event queue holds about as
many entries as the simulator's. Generation takes ``output_tokens`` decode steps of a
fixed length; the times do not change the amount of work, only the order of events.

    python bench/bare_simpy.py TRACE --steps 2 --tasks-per-step 64
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Sequence

import simpy

from rlsched.sim.workload import Workload

DECODE_STEP_S = 0.02  # seconds per generated token (any positive value does)


def bare_events(workload: Workload, batches: Sequence[Sequence[tuple[str, str]]]) -> int:
    """Events :func:`bare_run` processes: two per turn plus a process start and end each."""
    idx = [workload.index[t] for b in batches for _, t in b]
    return int(2 * workload.turns[idx].sum() + 2 * len(idx))


def bare_run(
    workload: Workload, batches: Sequence[Sequence[tuple[str, str]]], *, gc_off: bool = False
) -> tuple[float, int]:
    """Run the bare loop; return (wall seconds, events processed). Per-turn data is turned
    into Python lists first (outside the timing) so the loop measures SimPy, not NumPy.
    ``gc_off`` pauses the cyclic garbage collector during the loop, as the simulator does."""
    gen = (workload.output * DECODE_STEP_S).tolist()
    tool = workload.env.tolist()
    starts = workload.start.tolist()
    turns = workload.turns.tolist()
    plan = [[(starts[workload.index[t]], turns[workload.index[t]]) for _, t in b] for b in batches]
    env = simpy.Environment()
    timeout = env.timeout

    def trajectory(first: int, n: int):
        for k in range(first, first + n):
            yield timeout(gen[k])
            yield timeout(tool[k])

    was = gc.isenabled()
    if gc_off:
        gc.disable()
    t0 = time.perf_counter()
    try:
        for step in plan:
            for first, n in step:
                env.process(trajectory(first, n))
            env.run()
    finally:
        if was:
            gc.enable()
    wall = time.perf_counter() - t0
    return wall, bare_events(workload, batches)


def main() -> None:
    from rlsched.traces import draw_batches, load_trace

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--tasks-per-step", type=int, default=64)
    a = ap.parse_args()
    df = load_trace(a.trace)
    batches = draw_batches(df, a.steps, tasks_per_step=a.tasks_per_step)
    w = Workload.from_frame(df)
    del df
    for gc_off in (False, True):
        wall, events = bare_run(w, batches, gc_off=gc_off)
        print(f"bare SimPy loop (gc {'paused' if gc_off else 'on'}): {events:,} events in "
              f"{wall:.2f} s = {events / wall:,.0f} events/s ({wall / events * 1e6:.2f} us/event)")


if __name__ == "__main__":
    main()
