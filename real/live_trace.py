"""Events and commands of a live run, written to the run record as the simulator writes
them (same ``kind`` names and fields), so the analysis reads both drivers alike."""

from __future__ import annotations

from rlsched.cluster.commands import Command, Dispatch, Reassign, Train, TrainMicroBatch
from rlsched.cluster.events import (
    EngineIdle,
    Event,
    MicroBatchFinished,
    RolesChanged,
    SyncFailed,
    TimerFired,
    TrainerFailed,
    TrainStepFinished,
    TrajectoryFinished,
    WeightsSynced,
    WorkerFailed,
    WorkerRecovered,
)
from rlsched.cluster.record import RunRecorder, ids_text
from rlsched.cluster.state import ClusterState


def describe_event(rec: RunRecorder, now: float, ev: Event, st: ClusterState) -> None:
    match ev:
        case TrajectoryFinished(trajectory=t, status=s, engine=e):
            rec.event(now, "TrajectoryFinished", step=st.trajs[t].step, engine=e, trajectory=t, detail=s.value)
        case TrainStepFinished(version=v):
            rec.event(now, "TrainStepFinished", version=v, step=v - 1)
        case WeightsSynced(engines=es, version=v):
            rec.event(now, "WeightsSynced", version=v, detail=ids_text(es))
        case RolesChanged(gpus=g, role=r):
            rec.event(now, "RolesChanged", detail=f"{r.value} {ids_text(g)}")
        case EngineIdle(engine=e):
            rec.event(now, "EngineIdle", engine=e)
        case TimerFired(tag=tag):
            rec.event(now, "TimerFired", detail=tag)
        case MicroBatchFinished(trajectories=ts):
            rec.event(now, "MicroBatchFinished", version=st.version, detail=str(len(ts)))
        case WorkerFailed(gpu=g, trajectories=ts):
            rec.event(now, "WorkerFailed", gpu=g, detail=f"{len(ts)} trajectories interrupted")
        case WorkerRecovered(gpu=g):
            rec.event(now, "WorkerRecovered", gpu=g)
        case TrainerFailed(version=v, restart_s=r):
            rec.event(now, "TrainerFailed", version=v, detail=f"restart {r:g}s")
        case SyncFailed(engines=es, version=v, retry_s=r):
            rec.event(now, "SyncFailed", version=v, detail=f"{ids_text(es)} retry {r:g}s")
        case _:
            rec.event(now, type(ev).__name__)


def describe_command(rec: RunRecorder, now: float, cmd: Command, st: ClusterState) -> None:
    match cmd:
        case Dispatch(trajectories=ts, engine=e):
            rec.event(now, "Dispatch", engine=-1 if e is None else e, detail=str(len(ts)))
        case Reassign(gpus=g, role=r, drain=d):
            rec.event(now, "Reassign", detail=f"{r.value} {d.value} {ids_text(g)}")
        case TrainMicroBatch(trajectories=ts) | Train(trajectories=ts):
            rec.event(now, type(cmd).__name__, version=st.version, detail=str(len(ts)))
        case _:
            rec.event(now, type(cmd).__name__)
