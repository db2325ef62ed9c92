"""What both drivers write to the run record for the events and commands policies exchange.

One mapping, so a run record reads the same whichever driver wrote it: the ``kind`` is
the event's or command's class name and the fields it fills are fixed here. Turn-level
activity is never recorded per event (millions of rows at seed scale); drivers add their
own rarer rows (evictions, syncs, faults, notes) beside these.

The simulator's text is the reference (its run records are fingerprinted); the live
driver used to write ``WorkerFailed``'s detail as a bare count and had no row text for
``Move``, ``TrainerFailed``, ``ToolTimedOut`` and ``SyncFailed``.
"""

from __future__ import annotations

from typing import Protocol

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
from rlsched.cluster.state import ClusterState


class EventSink(Protocol):
    """Where rows go: :class:`~rlsched.cluster.record.RunRecorder` (simulator) or the live
    driver's in-memory recorder; both take this call."""

    def event(self, time: float, kind: str, *, step: int = -1, version: int = -1, engine: int = -1,
              gpu: int = -1, trajectory: str = "", detail: str = "") -> None: ...


def record_event(rec: EventSink, now: float, ev: Event, st: ClusterState) -> None:
    """Write the row of one policy event (before the policy sees it)."""
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
        case ToolTimedOut(trajectory=t, seconds=sec):
            rec.event(now, "ToolTimedOut", step=st.trajs[t].step, trajectory=t, detail=f"{sec:g}s")
        case SyncFailed(engines=es, version=v, retry_s=r):
            rec.event(now, "SyncFailed", version=v, detail=f"{ids_text(es)} retry {r:g}s")
        case _:
            rec.event(now, type(ev).__name__)


def record_command(rec: EventSink, now: float, cmd: Command, st: ClusterState) -> None:
    """Write the row of one command (after its legality check, before it is applied)."""
    match cmd:
        case Dispatch(trajectories=ts, engine=e):
            rec.event(now, "Dispatch", engine=-1 if e is None else e, detail=str(len(ts)))
        case Move(trajectories=ts, engine=e):
            rec.event(now, "Move", engine=-1 if e is None else e,
                      trajectory=ts[0] if len(ts) == 1 else "", detail=str(len(ts)))
        case Reassign(gpus=g, role=r, drain=d):
            rec.event(now, "Reassign", detail=f"{r.value} {d.value} {ids_text(g)}")
        case TrainMicroBatch(trajectories=ts) | Train(trajectories=ts):
            rec.event(now, type(cmd).__name__, version=st.version, detail=str(len(ts)))
        case _:
            rec.event(now, type(cmd).__name__)
