"""The trainer and weight sync in the simulator: the driver loop's trainer jobs
(:class:`~rlsched.cluster.loop.trainer_queue.TrainerQueue`, FIFO) are charged seconds from
the cost model on the GPUs in role TRAIN (:class:`~rlsched.sim.trainer.TrainerSim`);
``SyncWeights`` stalls the named engines for the cost model's sync time, then gives them
the version."""

from __future__ import annotations

from rlsched.cluster.events import SyncFailed, WeightsSynced
from rlsched.cluster.ids import GpuState
from rlsched.cluster.loop.trainer_queue import MicroBatchJob, TrainerJob
from rlsched.cluster.record import ids_text

from .core import DriverCore
from .memory import train_job_s
from .traj import SimTraj


class Training(DriverCore):
    """Methods of :class:`~rlsched.sim.driver.SimDriver` for training and weight sync."""

    # ---------------------------------------------------------------- sync
    def _sync(self, engines: tuple[int, ...]) -> None:
        now = self.now
        version = self.state.version
        secs = self.cost.sync_s()
        end = now
        per_engine = self.cost.gpus_per_node > 0  # with a topology: by where the trainer is
        for e in engines:
            eng = self.engines[e]
            if per_engine:
                secs = self._sync_seconds(eng.first_gpu)
            eng.sync_end = eng.stall(now, secs)
            end = max(end, eng.sync_end)
            eng.es.syncing = True
            self._engine_touch(eng)
        if self.rec is not None:
            self.rec.event(now, "SyncStart", version=version, detail=ids_text(engines))
        self._later(end - now, self._sync_done, engines, version)

    def _sync_seconds(self, first: int) -> float:
        """Sync time of the engine at ``first`` under a topology: over NVLink when every
        domain it spans holds a trainer GPU (the weights are next door), else the NICs."""
        c, tp = self.cost, self.cfg.tp
        n = c.gpus_per_node
        near = {g // n for g in self.trainer.gpus}
        local = bool(near) and all(d in near for d in range(first // n, (first + tp - 1) // n + 1))
        return c.sync_s(tp, local)

    def _sync_done(self, engines: tuple[int, ...], version: int) -> None:
        live = tuple(e for e in engines if e in self.engines)
        if self.fault.sync_fails and live:
            self._sync_failed(live, version)
            return
        for e in live:
            eng = self.engines[e]
            eng.version = version
            eng.es.version = version
            eng.es.syncing = False
            self._engine_touch(eng)
            eng.rearm(self.now)
        if self.rec is not None:
            self.rec.event(self.now, "SyncEnd", version=version, detail=ids_text(live))
        self._emit(WeightsSynced(live, version))

    def _sync_failed(self, live: tuple[int, ...], version: int) -> None:
        """An armed sync fault hits this sync: the engines keep their weights and go on
        generating; the same engines are synced again after ``sync_retry_s``."""
        f = self.fault
        f.sync_fails -= 1
        retry = f.schedule.sync_retry_s if f.schedule else 0.0
        for e in live:
            eng = self.engines[e]
            eng.es.syncing = False
            self._engine_touch(eng)
            eng.rearm(self.now)
        lost = self.cost.sync_s() * self.cfg.tp * len(live)
        f.stats["sync_gpu_seconds_lost"] += lost
        if self.rec is not None:
            self.rec.event(self.now, "Fault", version=version,
                           detail=f"sync: weight sync of version {version} to engines {ids_text(live)} "
                                  f"failed ({lost:.1f} GPU-s lost); retry in {retry:g}s")
        self._emit(SyncFailed(live, version, retry))
        self._later(retry, self._sync_retry, live)

    def _sync_retry(self, engines: tuple[int, ...], _unused: None) -> None:
        self._sync(tuple(e for e in engines if e in self.engines))

    # ------------------------------------------------------------- trainer
    def _trained_tokens(self, tid: str) -> int:
        t = self.trajs[tid]
        return t.ctx if t.charged < 0 else t.charged

    def _full_context_flops(self, tids: list[str], trajs: dict[str, SimTraj]) -> float:
        """Default charge: each trajectory trained as one packed sequence of its kept context."""
        f = self.cost.train_flops
        return float(sum(f(trajs[t].ctx) for t in tids))

    def _start_job(self, job: TrainerJob) -> None:
        """Run ``job`` (the loop's queue checked the trainer is free and
        ``SimBackend.trainer_ready``): charge its seconds, report it done after them."""
        tr = self.trainer
        now = self.now
        gpus = tr.current()
        if isinstance(job, MicroBatchJob):
            flops = self._charge(list(job.trajectories), self.trajs)
            if self.layout.memory is None:
                secs = self.cost.train_s(flops, len(gpus))
            else:  # usable width, context-parallel traffic, gradient reduction (see .memory)
                tokens = float(sum(self._trained_tokens(t) for t in job.trajectories))
                spans = len({g // (self.cost.gpus_per_node or 8) for g in gpus}) > 1
                secs = train_job_s(self.cost, self.layout, flops, tokens, len(gpus), spans)
        else:
            secs = self.cost.optimizer_step_s
        tr.run_token += 1
        tr.run_started, tr.run_gpus, tr.run_seconds = now, gpus, secs
        self.gpus.set_runs(tr.runs(gpus), GpuState.TRAIN, now, step=self.state.version)
        self._later(secs, self._trainer_done, job, (gpus, tr.run_token, secs))

    def _trainer_done(self, job: TrainerJob, run: tuple[tuple[int, ...], int, float]) -> None:
        tr = self.trainer
        gpus, token, secs = run
        if token != tr.run_token:
            return  # aborted by a fault (re-queued, see .faults)
        self.gpus.set_runs(tr.runs(gpus), GpuState.TRAIN_IDLE, self.now)
        if isinstance(job, MicroBatchJob):
            tr.done_jobs.append((job, secs, len(gpus)))
        else:
            tr.done_jobs = []
        self.loop.trainer.job_finished(job, secs)
