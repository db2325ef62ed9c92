"""The contract between policies and drivers: ids, events, commands, the view, the Policy
protocol and the run-record format. No heavy dependencies; everything else builds on it."""

from .commands import (
    Command,
    Dispatch,
    Drop,
    Interrupt,
    OptimizerStep,
    Reassign,
    SetTimer,
    SyncWeights,
    Train,
    TrainMicroBatch,
)
from .errors import (
    ConfigError,
    LiveBackendError,
    PolicyError,
    RecordError,
    RlschedError,
    TraceError,
)
from .events import (
    EngineIdle,
    Event,
    MicroBatchFinished,
    RolesChanged,
    RunStarted,
    TimerFired,
    TrainStepFinished,
    TrajectoryFinished,
    WeightsSynced,
    WorkerFailed,
)
from .ids import Drain, EngineId, GpuId, GpuState, Role, TaskId, TrajectoryId, TrajStatus
from .policy import Param, Policy
from .view import ClusterView, EngineInfo, TrainerInfo, TrajectoryInfo

__all__ = [
    "ClusterView", "Command", "ConfigError", "Dispatch", "Drain", "Drop", "EngineId",
    "EngineIdle", "EngineInfo", "Event", "GpuId", "GpuState", "Interrupt", "LiveBackendError",
    "MicroBatchFinished", "OptimizerStep", "Param", "Policy", "PolicyError", "Reassign",
    "RecordError", "RlschedError", "Role", "RolesChanged", "RunStarted", "SetTimer",
    "SyncWeights", "TaskId", "TimerFired", "TraceError", "Train", "TrainMicroBatch",
    "TrainStepFinished", "TrainerInfo", "TrajStatus", "TrajectoryFinished", "TrajectoryId",
    "TrajectoryInfo", "WeightsSynced", "WorkerFailed",
]
