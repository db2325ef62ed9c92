"""What the simulator writes to the run record for policy events and commands.

Turn-level activity is not recorded per event (it would be millions of rows at seed
scale); the record gets the events and commands policies exchange, the rarer
simulator-side happenings (evictions, migrations, switches, syncs) and, through
:class:`~rlsched.sim.gpus.GpuStates`, per-GPU state intervals. The recorder buffers rows
in columns and writes them in row groups.
"""

from __future__ import annotations

from rlsched.cluster.commands import Command, Dispatch, Move, Reassign, Train, TrainMicroBatch
from rlsched.cluster.events import (
    EngineIdle,
    Event,
    MicroBatchFinished,
    RolesChanged,
    SyncFailed,
    TimerFired,
    ToolTimedOut,
    TrainerFailed,
    TrainStepFinished,
    TrajectoryFinished,
    WeightsSynced,
    WorkerFailed,
    WorkerRecovered,
)
from rlsched.cluster.record import ids_text

from .core import DriverCore


class Recording(DriverCore):
    """Methods of :class:`~rlsched.sim.driver.SimDriver` that write policy traffic."""

    def _record_event(self, ev: Event) -> None:
        if self.rec is None:
            return
        now = self.now
        match ev:
            case TrajectoryFinished(trajectory=t, status=s, engine=e):
                self.rec.event(now, "TrajectoryFinished", step=self.state.trajs[t].step,
                               engine=e, trajectory=t, detail=s.value)
            case TrainStepFinished(version=v):
                self.rec.event(now, "TrainStepFinished", version=v, step=v - 1)
            case WeightsSynced(engines=es, version=v):
                self.rec.event(now, "WeightsSynced", version=v, detail=ids_text(es))
            case RolesChanged(gpus=g, role=r):
                self.rec.event(now, "RolesChanged", detail=f"{r.value} {ids_text(g)}")
            case EngineIdle(engine=e):
                self.rec.event(now, "EngineIdle", engine=e)
            case TimerFired(tag=tag):
                self.rec.event(now, "TimerFired", detail=tag)
            case MicroBatchFinished(trajectories=ts):
                self.rec.event(now, "MicroBatchFinished", version=self.state.version, detail=str(len(ts)))
            case WorkerFailed(gpu=g, trajectories=ts):
                self.rec.event(now, "WorkerFailed", gpu=g, detail=f"{len(ts)} trajectories interrupted")
            case WorkerRecovered(gpu=g):
                self.rec.event(now, "WorkerRecovered", gpu=g)
            case TrainerFailed(version=v, restart_s=r):
                self.rec.event(now, "TrainerFailed", version=v, detail=f"restart {r:g}s")
            case ToolTimedOut(trajectory=t, seconds=sec):
                self.rec.event(now, "ToolTimedOut", step=self.state.trajs[t].step, trajectory=t,
                               detail=f"{sec:g}s")
            case SyncFailed(engines=es, version=v, retry_s=r):
                self.rec.event(now, "SyncFailed", version=v, detail=f"{ids_text(es)} retry {r:g}s")
            case _:
                self.rec.event(now, type(ev).__name__)

    def _record_command(self, cmd: Command) -> None:
        if self.rec is None:
            return
        now = self.now
        match cmd:
            case Dispatch(trajectories=ts, engine=e):
                self.rec.event(now, "Dispatch", engine=-1 if e is None else e, detail=str(len(ts)))
            case Move(trajectories=ts, engine=e):
                self.rec.event(now, "Move", engine=-1 if e is None else e,
                               trajectory=ts[0] if len(ts) == 1 else "", detail=str(len(ts)))
            case Reassign(gpus=g, role=r, drain=d):
                self.rec.event(now, "Reassign", detail=f"{r.value} {d.value} {ids_text(g)}")
            case TrainMicroBatch(trajectories=ts) | Train(trajectories=ts):
                self.rec.event(now, type(cmd).__name__, version=self.state.version, detail=str(len(ts)))
            case _:
                self.rec.event(now, type(cmd).__name__)
