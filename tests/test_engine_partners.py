"""An engine of tp > 1 opens when the last of its GPUs has switched to rollout, not the
first: its GPUs may start their switches at different times (one idle, switching at
once; one in the trainer, waiting for the running job). Opened with the first, the
engine served while its other half still switched (and a policy shown it as an engine
sent that half on again -- an illegal Reassign found under GPU faults); or, when the
other half was still in the trainer, both halves went idle and the engine never opened."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rlsched.cluster.commands import Dispatch, Reassign, SetTimer, Train
from rlsched.cluster.config import RunConfig
from rlsched.cluster.events import EngineIdle, RunStarted, TimerFired, TrajectoryFinished
from rlsched.cluster.faults import Fault, FaultSchedule
from rlsched.cluster.ids import Role
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload

from simkit import APPROX, HAND_COST, FakeScript, trace

# A: one turn of 10 tokens (10 s of decode); B: one token
DF = trace([("t", "A", 0, 10, 10, 0.0), ("u", "B", 0, 10, 1, 0.0)])


def _script(seen: list):
    """Engine 0 (GPUs 0, 1) rolls out A while GPU 2 trains and GPU 3 idles; when A ends
    its step trains on GPU 2, and GPUs 2 and 3 are sent to rollout together (3 switches
    at once, 2 after the training job); engine 1 rolls out B, then 0 and 1 train it."""
    state = {"a": False, "b": False}

    def script(event, view):
        if isinstance(event, RunStarted):
            return [Reassign((0, 1), Role.ROLLOUT), Reassign((2,), Role.TRAIN)]
        if isinstance(event, EngineIdle) and event.engine == 0 and not state["a"]:
            state["a"] = True
            return [Dispatch(("A",), 0)]
        if isinstance(event, TrajectoryFinished) and event.trajectory == "A":
            return [Train(("A",)), Reassign((2, 3), Role.ROLLOUT)]
        if isinstance(event, EngineIdle) and event.engine == 1 and not state["b"]:
            state["b"] = True
            seen.append((view.now, view.role(2), view.role(3), view.engines()))
            return [Dispatch(("B",), 1), Reassign((0, 1), Role.TRAIN)]
        if isinstance(event, TrajectoryFinished) and event.trajectory == "B":
            return [Train(("B",))]
        return []

    return script


@pytest.mark.parametrize(("mfu", "job_s"), [(1.2e-10, 0.5), (1e-11, 6.0)])
def test_an_engine_opens_when_its_last_gpu_has_switched(mfu, job_s):
    # A's micro-batch (20 tokens, 6 * 0.5e9 FLOPs each at 1e21 * mfu FLOP/s) takes job_s;
    # a switch takes 1 s. With 0.5 s GPU 3 lands at a+1 while GPU 2 still switches (until
    # a+1.5); with 6 s, while GPU 2 is still in the trainer (it switches a+6 .. a+7).
    # Either way engine 1 opens, whole, when GPU 2 lands.
    seen: list = []
    cost = replace(HAND_COST, train_mfu=mfu)
    cfg = RunConfig(gpus=4, tp=2, steps=2, check=True)
    out = simulate(Workload.from_frame(DF), [[("A", "A")], [("B", "B")]],
                   FakeScript(_script(seen), staleness=1), cfg, cost)
    res = out.result
    assert res.complete
    a_done = res.state.trajs["A"].finish_time
    assert len(seen) == 1
    now, role2, role3, engines = seen[0]
    assert now == pytest.approx(a_done + job_s + 1.0, **APPROX)
    assert (role2, role3) == (Role.ROLLOUT, Role.ROLLOUT)
    assert 1 in engines


def test_a_gpu_waiting_for_its_partner_goes_idle_when_the_partner_fails():
    # as above with A's micro-batch 6 s: GPU 3 lands at 7 and waits for GPU 2, which fails
    # in the trainer at 8 (its job is re-run later). GPU 3 is then idle, not rolling out
    # alone; engine 0 rolls out B and GPUs 0 and 1 train both steps.
    seen: list = []

    def script(event, view):
        if isinstance(event, RunStarted):
            return [Reassign((0, 1), Role.ROLLOUT), Reassign((2,), Role.TRAIN),
                    SetTimer(7.5, "parked"), SetTimer(8.5, "lost")]
        if isinstance(event, TimerFired):
            seen.append((event.tag, view.role(2), 2 in view.failed_gpus(), view.role(3), view.engines()))
            return [Dispatch(("B",), 0)] if event.tag == "lost" else []
        if isinstance(event, EngineIdle) and event.engine == 0 and view.now < 2:
            return [Dispatch(("A",), 0)]
        if isinstance(event, TrajectoryFinished) and event.trajectory == "A":
            return [Train(("A",)), Reassign((2, 3), Role.ROLLOUT)]
        if isinstance(event, TrajectoryFinished) and event.trajectory == "B":
            return [Reassign((0, 1), Role.TRAIN), Train(("B",))]
        return []

    cfg = RunConfig(gpus=4, tp=2, steps=2, check=True,
                    faults=FaultSchedule((Fault("gpu", at=8.0, gpu=2),), recover_s=100.0))
    out = simulate(Workload.from_frame(DF), [[("A", "A")], [("B", "B")]],
                   FakeScript(script, staleness=1), cfg, replace(HAND_COST, train_mfu=1e-11))
    assert out.result.complete
    assert seen == [("parked", Role.TRAIN, False, Role.SWITCHING, (0,)),
                    ("lost", Role.IDLE, True, Role.IDLE, (0,))]
