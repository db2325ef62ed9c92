"""Shape of the simulator's cost, without timing anything (timings live in
bench/bench_scale.py): simulated events grow with turns, not with tokens or GPUs; a
Ctrl-C stops a run cleanly with what was simulated recorded as incomplete; the garbage
collector the driver pauses is back on afterwards."""

import gc
import json

import pandas as pd
import pytest

from rlsched.cluster.config import RunConfig
from rlsched.policies import make_policy
from rlsched.sim.cost import CostModel
from rlsched.sim.run import simulate

from simkit import synthetic


def events(spec: str, n_traj: int, turns: int, tokens: float, gpus: int = 32) -> tuple[int, int]:
    """(events processed, turns simulated)."""
    w, b = synthetic(n_traj, turns, tokens)
    out = simulate(w, b, make_policy(spec), RunConfig(gpus=gpus, tp=4, steps=len(b)), CostModel())
    assert out.result.complete
    turns_done = sum(ts.turns_done for ts in out.result.state.trajs.values())
    return out.result.events_processed, turns_done


@pytest.mark.parametrize("spec", ["colocated", "partial", "async:rollout_fraction=0.5,staleness=1"])
def test_events_follow_turns_not_tokens_or_gpus(spec):
    """Events per extra turn stay about two (decode end, tool return) to three (plus a
    wake-up made early by another sequence joining the batch), whatever the tokens per
    turn, the cluster size or the number of trajectories. Role switches add a per-GPU,
    per-step constant, which the differences cancel."""

    def per_turn(n_traj, tokens=1.0, gpus=32):
        (e1, t1), (e2, t2) = events(spec, n_traj, 8, tokens, gpus), events(spec, n_traj, 16, tokens, gpus)
        return (e2 - e1) / (t2 - t1)

    for value in (per_turn(16), per_turn(16, gpus=128), per_turn(16, tokens=100.0), per_turn(32)):
        assert 1.8 <= value <= 3.0


@pytest.mark.parametrize("spec", ["colocated", "elastic"])
def test_ctrl_c_stops_cleanly_and_records_incomplete(tmp_path, spec):
    w, b = synthetic(8, 6, 1.0, steps=4)
    seen = []

    def progress(done: int, total: int, now: float) -> None:
        seen.append(done)
        if done == 2:
            raise KeyboardInterrupt

    out = simulate(w, b, make_policy(spec), RunConfig(gpus=16, tp=4, steps=4), CostModel(),
                   out_dir=tmp_path / "run", progress=progress)
    assert seen == [1, 2]
    assert not out.result.complete
    assert out.result.state.version == 2
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["complete"] is False and meta["steps_done"] == 2
    steps = pd.read_parquet(tmp_path / "run" / "steps.parquet")
    assert list(steps.version) == [1, 2]
    # the GPU intervals still tile [0, time of the interrupt] for every GPU
    iv = pd.read_parquet(tmp_path / "run" / "intervals.parquet")
    covered = ((iv.end - iv.start) * iv.gpu_count).sum()
    assert covered == pytest.approx(16 * out.result.makespan)
    assert gc.isenabled()


def test_gc_state_is_restored():
    w, b = synthetic(4, 3, 1.0, steps=1)
    gc.disable()
    try:
        simulate(w, b, make_policy("colocated"), RunConfig(gpus=8, tp=4, steps=1), CostModel())
        assert not gc.isenabled()
    finally:
        gc.enable()
    simulate(w, b, make_policy("colocated"), RunConfig(gpus=8, tp=4, steps=1), CostModel())
    assert gc.isenabled()
