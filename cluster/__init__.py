"""The contract between policies and drivers: ids, events, commands, the view, the Policy
protocol and the run-record format. No heavy dependencies; everything else builds on it."""

from .commands import (
    Command,
    Dispatch,
    Drop,
    Interrupt,
    Move,
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
from .faults import Fault, FaultSchedule
from .ids import Drain, EngineId, GpuId, GpuState, Role, TaskId, TrajectoryId, TrajStatus
from .policy import Param, Policy
from .view import ClusterView, EngineInfo, TrainerInfo, TrajectoryInfo

__all__ = [
    "ClusterView", "Command", "ConfigError", "Dispatch", "Drain", "Drop", "EngineId",
    "EngineIdle", "EngineInfo", "Event", "Fault", "FaultSchedule", "GpuId", "GpuState",
    "Interrupt", "LiveBackendError", "MicroBatchFinished", "Move", "OptimizerStep", "Param", "Policy",
    "PolicyError", "Reassign", "RecordError", "RlschedError", "Role", "RolesChanged",
    "RunStarted", "SetTimer", "SyncFailed", "SyncWeights", "TaskId", "TimerFired",
    "ToolTimedOut", "TraceError", "Train", "TrainMicroBatch", "TrainStepFinished",
    "TrainerFailed", "TrainerInfo", "TrajStatus", "TrajectoryFinished", "TrajectoryId",
    "TrajectoryInfo", "WeightsSynced", "WorkerFailed", "WorkerRecovered",
]
