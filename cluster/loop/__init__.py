"""One driver loop: the policy contract's meaning, written once; the simulator and the live
driver are two backends of it.

A policy is written once and both drivers must execute its commands with the same
meaning. So the meaning lives here, below both drivers, and each driver implements only
the backend -- *how* the work is done and how long it takes:

``driver_loop.DriverLoop``
    The event FIFO and the pump: each event is recorded, handed to the policy, and every
    command it answers is checked (``legality.check``), recorded and applied before
    the next event. Applying a command means calling the backend (``Dispatch``,
    ``Reassign``, ``Move``, ``Interrupt``, ``Drop``'s clean-up, ``SetTimer``,
    ``SyncWeights``) or the trainer queue (``TrainMicroBatch``, ``Train``,
    ``OptimizerStep``); the state change a command itself defines (``Drop`` marks its
    trajectories dropped) is made here.
``trainer_queue.TrainerQueue``
    The trainer's FIFO of micro-batch and optimizer-step jobs, the accumulation, the
    version bump and the step rows (with ``max_staleness``), and the ``ClusterState``
    trainer fields policies read. The backend runs a job (``start_job``) and reports its
    seconds back (``job_finished``).
``backend.Backend``
    The protocol a driver implements: ``now``, ``dispatch``, ``reassign``, ``move``,
    ``interrupt``, ``drop``, ``set_timer``, ``sync`` and, for the trainer,
    ``trainer_ready``, ``start_job``, ``trained_tokens``, ``step_finished`` and
    ``job_released``. The simulator's (``rlsched.sim.backend.SimBackend``) charges seconds
    from the cost model on the SimPy clock; the live driver's
    (``rlsched.real.loop.backend.LiveBackend``) submits to vLLM engines, the Megatron
    trainer lane and the sandboxes on the wall clock. Work that completes later comes
    back as events (``DriverLoop.emit``) and job reports.
``recording``
    The one mapping from events and commands to run-record rows.
``run_meta.RunMeta``
    The run record's ``meta.json`` keys, typed once.

What stays in each driver: its clock and how time passes (SimPy timers and the compiled
per-turn inner loop in the simulator -- per-turn work never passes through this package,
only policy events and commands do; a completion queue over Ray futures and worker
threads live), engines, role switches, weight sync, faults, and writing the record files.
Each driver is composed of collaborators with stated fields -- the simulator's rollout
core, ``Roles``, ``Training`` and ``Faults`` (``rlsched.sim.core``); the live driver's
``loop.rollout``, ``loop.roles`` and ``loop.training`` -- and its backend calls only their
public methods. Both write a trajectory's placement (dispatched, admitted, requeued,
moved, finished) only through ``ClusterState``'s driver API (``mark_*``,
``enqueue_unbound``/``take_unbound``), the store's one writer.

No heavy dependency and no SimPy here: this is part of ``cluster``, which both drivers
import and which imports neither.
"""

from .backend import Backend
from .driver_loop import DriverLoop
from .recording import record_command, record_event
from .run_meta import RunMeta
from .trainer_queue import MicroBatchJob, OptimizerJob, TrainerBackend, TrainerJob, TrainerQueue

__all__ = [
    "Backend",
    "DriverLoop",
    "MicroBatchJob",
    "OptimizerJob",
    "RunMeta",
    "TrainerBackend",
    "TrainerJob",
    "TrainerQueue",
    "record_command",
    "record_event",
]
