"""``SimResult.gpu_seconds``: GPU-seconds per GPU state (a ``GpuState`` value), kept by the
simulator as it writes its intervals -- what ``rlsched plan`` reads for a configuration's
utilization without writing a run record. Checked against a hand-computed timeline and
against the record's own intervals (with and without faults, compiled or not)."""

from __future__ import annotations

from collections import defaultdict

import pandas as pd
import pytest

from rlsched.cluster.commands import Dispatch, Reassign, Train
from rlsched.cluster.config import RunConfig
from rlsched.cluster.events import RolesChanged, RunStarted, TrajectoryFinished
from rlsched.cluster.faults import Fault, FaultSchedule
from rlsched.cluster.ids import Role
from rlsched.policies import make_policy
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload

from simkit import HAND_COST, trace


class FakeTwoGpus:
    """A fake policy: GPU 0 rolls out A, GPU 1 trains it."""

    name = "fake-two-gpus"
    params = ()
    max_staleness = 0
    defers = False

    def reset(self, view, rng) -> None:
        pass

    def on_event(self, event, view):
        if isinstance(event, RunStarted):
            return [Reassign((0,), Role.ROLLOUT), Reassign((1,), Role.TRAIN)]
        if isinstance(event, RolesChanged) and event.gpus == (0,):
            return [Dispatch(("A",), 0)]
        if isinstance(event, TrajectoryFinished):
            return [Train(("A",))]
        return []


def test_gpu_seconds_of_a_hand_computed_run():
    # HAND_COST: 1 s role switches, 1 s per decode step, prefill and training ~free. Both GPUs
    # switch [0, 1]; GPU 0 generates A's 3 tokens [1, 4] and waits for its 2 s tool call
    # [4, 6]; GPU 1 holds the trainer with nothing to train [1, 6]; A trains (~0 s) and the
    # run ends at 6.
    w = Workload.from_frame(trace([("t", "A", 0, 10, 3, 2.0)]))
    out = simulate(w, [[("A", "A")]], FakeTwoGpus(), RunConfig(gpus=2, tp=1, steps=1, check=True), HAND_COST)
    r = out.result
    assert r.makespan == pytest.approx(6.0, abs=1e-6)
    got = {k: v for k, v in r.gpu_seconds.items() if v > 1e-6}
    assert got == pytest.approx({"switch": 2.0, "generate": 3.0, "tool_wait": 2.0, "train_idle": 5.0}, abs=1e-6)
    assert sum(r.gpu_seconds.values()) == pytest.approx(2 * r.makespan, rel=1e-12)


def _from_intervals(d) -> dict[str, float]:
    iv = pd.read_parquet(d / "intervals.parquet")
    out: dict[str, float] = defaultdict(float)
    for state, secs in zip(iv["state"], (iv["end"] - iv["start"]) * iv["gpu_count"], strict=True):
        out[state] += secs
    return {k: v for k, v in out.items() if v}


@pytest.mark.parametrize("spec", ["colocated", "elastic:staleness=1", "partial"])
@pytest.mark.parametrize("faulty", [False, True])
def test_gpu_seconds_sum_the_recorded_intervals(tmp_path, spec, faulty):
    rows = [(f"t{i % 3}", f"T{i}", k, 30, 4 + 7 * (i % 4), 0.5 * (i % 2)) for i in range(12) for k in range(1 + i % 3)]
    w = Workload.from_frame(trace(rows))
    batches = [[(f"T{i}", f"T{i}") for i in range(s, 12, 3)] for s in range(3)]
    faults = FaultSchedule((Fault("gpu", per_hour=120.0), Fault("tool", per_hour=300.0)), seed=2) if faulty else None
    out = simulate(w, batches, make_policy(spec), RunConfig(gpus=8, tp=2, steps=3, check=True), HAND_COST,
                   faults=faults, out_dir=tmp_path / "run", spec=spec)
    r = out.result
    assert r.complete
    if faulty:
        assert r.gpu_seconds.get("failed", 0.0) > 0  # (the faults fired)
    assert r.gpu_seconds == pytest.approx(_from_intervals(tmp_path / "run"), rel=1e-9, abs=1e-9)
    assert sum(r.gpu_seconds.values()) == pytest.approx(8 * r.makespan, rel=1e-9)
