"""Driver conformance: one scripted command sequence through both backends of the driver
loop (``rlsched.cluster.loop``) -- the simulator and the live driver on the CPU stack --
records the same policy traffic, modulo timing.

The scripted policy reassigns one GPU to rollout and one to training, sets a timer,
dispatches step 0 (interrupting one trajectory right after its dispatch and resuming it),
trains the step once everything finished, syncs the weights, then drops one trajectory of
step 1 and dispatches the rest. What may differ between the drivers is only *when*
things happen; what must not: the kinds recorded, each trajectory's causal order, the
step-level order, and the step rows (trajectories per step, versions, staleness).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

import pandas as pd
import pytest

from rlsched.cluster.commands import (
    Command,
    Dispatch,
    Drop,
    Interrupt,
    Reassign,
    SetTimer,
    SyncWeights,
    Train,
)
from rlsched.cluster.events import (
    Event,
    RolesChanged,
    RunStarted,
    TrainStepFinished,
    TrajectoryFinished,
    WeightsSynced,
)
from rlsched.cluster.ids import Role, TrajStatus
from rlsched.cluster.policy import Param
from rlsched.cluster.view import ClusterView

pytestmark = pytest.mark.live

STEPS, TASKS, SAMPLES = 2, 2, 2


class ScriptedPolicy:
    """A fake policy for this test: a fixed command script, keyed on events only (never
    on time), so both drivers receive the same commands in the same causal order."""

    name: ClassVar[str] = "scripted"
    params: ClassVar[tuple[Param, ...]] = ()
    max_staleness = 0
    defers = False

    def reset(self, view: ClusterView | None, rng: random.Random) -> None:
        self.roles_changed = 0
        self.expected: dict[int, int] = {}  # step -> trajectories dispatched (not dropped)

    def on_event(self, event: Event, view: ClusterView) -> Sequence[Command]:
        match event:
            case RunStarted():
                return [Reassign((0,), Role.ROLLOUT), Reassign((1,), Role.TRAIN),
                        SetTimer(view.now + 0.5, "tick")]
            case RolesChanged():
                self.roles_changed += 1
                if self.roles_changed < 2:
                    return []
                batch = view.batch(0)
                self.expected[0] = len(batch)
                return [Dispatch(batch), Interrupt((batch[0],), keep_progress=True)]
            case TrajectoryFinished(trajectory=t, status=TrajStatus.INTERRUPTED):
                return [Dispatch((t,))]
            case TrajectoryFinished(trajectory=t):
                step = view.trajectory(t).step
                done = view.finished(step)
                if len(done) == self.expected[step]:
                    return [Train(done)]
                return []
            case TrainStepFinished():
                return [SyncWeights(None)]
            case WeightsSynced(version=v) if v < view.num_steps:
                batch = view.batch(v)
                self.expected[v] = len(batch) - 1
                return [Drop((batch[-1],)), Dispatch(batch[:-1])]
        return []


POLICY_KINDS = ("RunStarted", "Reassign", "RolesChanged", "SetTimer", "TimerFired", "Dispatch",
                "Interrupt", "TrajectoryFinished", "Train", "MicroBatchFinished", "TrainStepFinished",
                "SyncWeights", "WeightsSynced", "Drop")
UNTIMED = ("TimerFired", "RolesChanged")  # (their place depends on timing; counted, not ordered)


def _traffic(events: pd.DataFrame) -> pd.DataFrame:
    return events[events["kind"].isin(POLICY_KINDS)].sort_values("time", kind="stable").reset_index(drop=True)


def _shape(events: pd.DataFrame, steps: pd.DataFrame, trajs: pd.DataFrame) -> dict:
    """The record as the conformance sees it: everything but times and names."""
    ev = _traffic(events)
    per_traj: dict[str, list[str]] = {}  # (done or cut at max_turns is the workload's, not the driver's)
    for kind, tid, detail in zip(ev["kind"], ev["trajectory"], ev["detail"], strict=True):
        if tid:
            interrupted = kind == "TrajectoryFinished" and detail == TrajStatus.INTERRUPTED.value
            per_traj.setdefault(tid, []).append(f"{kind}:interrupted" if interrupted else kind)
    ordered = ev[~ev["kind"].isin(UNTIMED)]
    # consecutive TrajectoryFinished rows collapse into one (their order among themselves is timing)
    seq: list[str] = []
    for kind in ordered["kind"]:
        if not (kind == "TrajectoryFinished" and seq and seq[-1] == kind):
            seq.append(kind)
    return {
        "counts": ev["kind"].value_counts().sort_index().to_dict(),
        "sequence": seq,
        "roles": sorted(ev.loc[ev["kind"] == "RolesChanged", "detail"]),
        "per_trajectory": sorted(per_traj.values()),
        "dropped": sorted(trajs.loc[trajs["status"] == "dropped", "step"]),
        "steps": steps[["version", "trajectories", "max_staleness"]].to_dict("records"),
    }


def _sim_record(tmp_path):
    from rlsched.cluster.config import RunConfig
    from rlsched.cluster.record import read_run
    from rlsched.sim.cost import CostModel
    from rlsched.sim.run import simulate
    from rlsched.sim.workload import Workload

    rows, steps = [], []
    for s in range(STEPS):
        ids = []
        for k in range(TASKS):
            for j in range(SAMPLES):
                tid = f"s{s}-t{k}-{j}"
                ids.append(tid)
                for turn in range(3):
                    rows.append((f"s{s}-t{k}", tid, turn, 40 if turn == 0 else 10, 16, 0.2))
        steps.append(ids)
    w = Workload.from_frame(pd.DataFrame(rows, columns=[
        "task_id", "trajectory_id", "turn", "prompt_tokens", "output_tokens", "env_seconds"]))
    out = tmp_path / "sim"
    simulate(w, [[(t, t) for t in ids] for ids in steps], ScriptedPolicy(),
             RunConfig(gpus=2, tp=1, steps=STEPS), CostModel(), out_dir=out, spec="scripted")
    return read_run(out)


def _live_record(cache, tmp_path):
    from rlsched.cluster.config import RunConfig
    from rlsched.cluster.record import read_run
    from rlsched.real.run import run_live

    live = {"tasks": ["fix-clamp", "fix-average-empty"], "tasks_per_step": TASKS, "samples_per_task": SAMPLES,
            "max_turns": 3, "max_tokens_per_turn": 16, "kv_cache_mb": 64, "tool_seconds": 5.0,
            "max_wall_s": 600.0, "cache_dir": str(cache)}
    out = run_live("scripted", make=lambda spec: (ScriptedPolicy(), "scripted"), steps=STEPS,
                   out_dir=tmp_path / "live", config={"run": RunConfig(gpus=2, tp=1, steps=STEPS), "live": live})
    return read_run(out)


def test_scripted_commands_record_the_same_traffic_on_both_backends(tiny_cache, tmp_path) -> None:
    sim = _sim_record(tmp_path)
    live = _live_record(tiny_cache, tmp_path)
    a = _shape(sim.events, sim.steps, sim.trajectories)
    b = _shape(live.events, live.steps, live.trajectories)
    # the script ran as written (so the comparison below compares something)
    assert a["steps"] == [{"version": 1, "trajectories": 4, "max_staleness": 0},
                          {"version": 2, "trajectories": 3, "max_staleness": 0}]
    assert a["dropped"] == [1]
    assert a["counts"]["Interrupt"] == 1 and a["counts"]["TimerFired"] == 1
    for key in ("steps", "dropped", "counts", "roles", "sequence", "per_trajectory"):
        assert a[key] == b[key], f"{key}: simulator {a[key]} != live {b[key]}"
