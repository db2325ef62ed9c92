"""The trainer and weight sync in the simulator: the driver loop's trainer jobs
(:class:`~rlsched.cluster.loop.trainer_queue.TrainerQueue`, FIFO) are charged seconds from
the cost model on the GPUs in role TRAIN (:class:`~rlsched.sim.trainer.TrainerSim`);
``SyncWeights`` stalls the named engines for the cost model's sync time, then gives them
the version."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rlsched.cluster.events import SyncFailed, WeightsSynced
from rlsched.cluster.ids import GpuState
from rlsched.cluster.loop.trainer_queue import MicroBatchJob, TrainerJob, TrainerQueue
from rlsched.cluster.record import ids_text

from .memory import TrainLayout, train_job_s, trainer_floor
from .trainer import TrainerSim
from .traj import SimTraj

if TYPE_CHECKING:
    from .faults import Faults
    from .lifecycle import Lifecycle


class Training:
    """The trainer and weight sync.

    Owns the trainer (``trainer``: its GPUs, the running job, the micro-batches done
    since the last optimizer step, its restart time), its memory layout (``layout``, the
    floor set on the store) and the charge of a micro-batch (``charge``). Calls the
    rollout core (``core``: engines to sync, timers, events, GPU states), the trainer
    queue (``queue``, the driver loop's: a job finished) and the faults (``faults``,
    set by :meth:`attach`: an armed sync failure).
    """

    def __init__(self, core: Lifecycle,
                 charge: Callable[[list[str], dict[str, SimTraj]], float] | None) -> None:
        self.core = core
        self.state = core.state
        self.cost = core.cost
        self.rec = core.rec
        self.gpus = core.gpus
        self.trainer = TrainerSim()
        self.layout: TrainLayout = trainer_floor(core.state, core.cost, core.cfg.tp, core.kv_capacity)
        self.charge = charge or self._full_context_flops

    def attach(self, queue: TrainerQueue, faults: Faults) -> None:
        self.queue = queue
        self.faults = faults

    def ready(self) -> bool:
        """May a job start now? Not without GPUs, while restarting after a fault, or
        below the trainer's memory floor."""
        tr = self.trainer
        return bool(tr.gpus) and tr.restart_until <= self.core.now and len(tr.gpus) >= self.layout.min_gpus

    # ---------------------------------------------------------------- sync
    def sync(self, engines: tuple[int, ...]) -> None:
        """``SyncWeights``: the engines stall for the sync, then serve the trainer's version."""
        now = self.core.now
        version = self.state.version
        secs = self.cost.sync_s()
        end = now
        per_engine = self.cost.gpus_per_node > 0  # with a topology: by where the trainer is
        for e in engines:
            eng = self.core.engines[e]
            if per_engine:
                secs = self._sync_seconds(eng.first_gpu)
            eng.sync_end = eng.stall(now, secs)
            end = max(end, eng.sync_end)
            eng.es.syncing = True
            self.core.engine_touch(eng)
        if self.rec is not None:
            self.rec.event(now, "SyncStart", version=version, detail=ids_text(engines))
        self.core.later(end - now, self._sync_done, engines, version)

    def _sync_seconds(self, first: int) -> float:
        """Sync time of the engine at ``first`` under a topology: over NVLink when every
        domain it spans holds a trainer GPU (the weights are next door), else the NICs."""
        c, tp = self.cost, self.core.cfg.tp
        n = c.gpus_per_node
        near = {g // n for g in self.trainer.gpus}
        local = bool(near) and all(d in near for d in range(first // n, (first + tp - 1) // n + 1))
        return c.sync_s(tp, local)

    def _sync_done(self, engines: tuple[int, ...], version: int) -> None:
        live = tuple(e for e in engines if e in self.core.engines)
        if live and self.faults.sync_fails:
            self._sync_failed(live, version)
            return
        for e in live:
            eng = self.core.engines[e]
            eng.version = version
            eng.es.version = version
            eng.es.syncing = False
            self.core.engine_touch(eng)
            eng.rearm(self.core.now)
        if self.state.unbound and live:
            # (work its old weights could not take may wait in the cluster queue)
            self.core.place_waiting()
        if self.rec is not None:
            self.rec.event(self.core.now, "SyncEnd", version=version, detail=ids_text(live))
        self.core.emit(WeightsSynced(live, version))

    def _sync_failed(self, live: tuple[int, ...], version: int) -> None:
        """An armed sync fault hits this sync: the engines keep their weights and go on
        generating; the same engines are synced again after ``sync_retry_s``."""
        for e in live:
            eng = self.core.engines[e]
            eng.es.syncing = False
            self.core.engine_touch(eng)
            eng.rearm(self.core.now)
        lost = self.cost.sync_s() * self.core.cfg.tp * len(live)
        retry = self.faults.sync_failed(live, version, lost)
        self.core.emit(SyncFailed(live, version, retry))
        self.core.later(retry, self._sync_retry, live)

    def _sync_retry(self, engines: tuple[int, ...], _unused: None) -> None:
        self.sync(tuple(e for e in engines if e in self.core.engines))

    # ------------------------------------------------------------- trainer
    def trained_tokens(self, tid: str) -> int:
        """Tokens ``tid`` is trained on: its kept context, or what the processor charged."""
        t = self.core.trajs[tid]
        return t.ctx if t.charged < 0 else t.charged

    def _full_context_flops(self, tids: list[str], trajs: dict[str, SimTraj]) -> float:
        """Default charge: each trajectory trained as one packed sequence of its kept context."""
        f = self.cost.train_flops
        return float(sum(f(trajs[t].ctx) for t in tids))

    def start_job(self, job: TrainerJob) -> None:
        """Run ``job`` (the loop's queue checked the trainer is free and
        ``SimBackend.trainer_ready``): charge its seconds, report it done after them."""
        tr = self.trainer
        now = self.core.now
        gpus = tr.current()
        if isinstance(job, MicroBatchJob):
            flops = self.charge(list(job.trajectories), self.core.trajs)
            if self.layout.memory is None:
                secs = self.cost.train_s(flops, len(gpus))
            else:  # usable width, context-parallel traffic, gradient reduction (see .memory)
                tokens = float(sum(self.trained_tokens(t) for t in job.trajectories))
                spans = len({g // (self.cost.gpus_per_node or 8) for g in gpus}) > 1
                secs = train_job_s(self.cost, self.layout, flops, tokens, len(gpus), spans)
        else:
            secs = self.cost.optimizer_step_s
        tr.run_token += 1
        tr.run_started, tr.run_gpus, tr.run_seconds = now, gpus, secs
        self.gpus.set_runs(tr.runs(gpus), GpuState.TRAIN, now, step=self.state.version)
        self.core.later(secs, self._trainer_done, job, (gpus, tr.run_token, secs))

    def _trainer_done(self, job: TrainerJob, run: tuple[tuple[int, ...], int, float]) -> None:
        tr = self.trainer
        gpus, token, secs = run
        if token != tr.run_token:
            return  # aborted by a fault (re-queued, see .faults)
        self.gpus.set_runs(tr.runs(gpus), GpuState.TRAIN_IDLE, self.core.now)
        if isinstance(job, MicroBatchJob):
            tr.done_jobs.append((job, secs, len(gpus)))
        else:
            tr.done_jobs = []
        self.queue.job_finished(job, secs)

    # ------------------------------------------------- a fault (see .faults)
    def abort_job(self) -> float:
        """The current step's gradients are gone: re-queue its finished micro-batches and
        the running job (in order, ahead of queued work). Returns the trainer GPU-seconds
        that work took."""
        tr = self.trainer
        now = self.core.now
        lost = 0.0
        done = [job for job, _, _ in tr.done_jobs]
        lost += sum(secs * n for _, secs, n in tr.done_jobs)
        running_seconds = None
        if self.queue.running is not None:
            lost += (now - tr.run_started) * len(tr.run_gpus)
            still = tuple(g for g in tr.run_gpus if g in tr.gpus)
            if still:
                self.gpus.set(still, GpuState.TRAIN_IDLE, now)
            tr.run_token += 1  # its completion, still scheduled, is ignored
            running_seconds = tr.run_seconds
        self.queue.requeue(running_seconds, done)
        tr.done_jobs = []
        return lost

    def restart(self, seconds: float) -> float:
        """The trainer restarts for ``seconds`` (no job starts before); returns the GPU
        time its GPUs wait."""
        tr = self.trainer
        tr.restart_until = self.core.now + seconds
        self.core.later(seconds, self._restarted)
        return seconds * len(tr.gpus)

    def _restarted(self, _a: None, _b: None) -> None:
        self.queue.next()
