"""The trainer and weight sync in the simulator: micro-batch and optimizer-step jobs run
FIFO on the GPUs in role TRAIN (:class:`~rlsched.sim.trainer.TrainerSim`); ``SyncWeights``
stalls the named engines for the cost model's sync time, then gives them the version."""

from __future__ import annotations

from rlsched.cluster.events import MicroBatchFinished, TrainStepFinished, WeightsSynced
from rlsched.cluster.ids import GpuState

from .core import DriverCore, SimTraj
from .recording import ids_text
from .trainer import MicroBatchJob, OptimizerJob


class Training(DriverCore):
    """Methods of :class:`~rlsched.sim.driver.SimDriver` for training and weight sync."""

    # ---------------------------------------------------------------- sync
    def _sync(self, engines: tuple[int, ...]) -> None:
        now = self.now
        version = self.state.version
        secs = self.cost.sync_s()
        end = now
        for e in engines:
            eng = self.engines[e]
            eng.sync_end = eng.stall(now, secs)
            end = max(end, eng.sync_end)
            eng.es.syncing = True
            self._engine_touch(eng)
        if self.rec is not None:
            self.rec.event(now, "SyncStart", version=version, detail=ids_text(engines))
        self._later(end - now, self._sync_done, engines, version)

    def _sync_done(self, engines: tuple[int, ...], version: int) -> None:
        live = tuple(e for e in engines if e in self.engines)
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

    # ------------------------------------------------------------- trainer
    def _trained_tokens(self, tid: str) -> int:
        t = self.trajs[tid]
        return t.ctx if t.charged < 0 else t.charged

    def _full_context_flops(self, tids: list[str], trajs: dict[str, SimTraj]) -> float:
        """Default charge: each trajectory trained as one packed sequence of its kept context."""
        f = self.cost.train_flops
        return float(sum(f(trajs[t].ctx) for t in tids))

    def _queue_micro_batch(self, tids: tuple[str, ...]) -> None:
        trajs = self.state.trajs
        for tid in tids:
            trajs[tid].in_micro_batch = True
        self.trainer.jobs.append(MicroBatchJob(tuple(tids)))
        self.state.queued_micro_batches += 1

    def _queue_optimizer_step(self) -> None:
        self.trainer.jobs.append(OptimizerJob())
        self.state.queued_optimizer_steps += 1

    def _trainer_next(self) -> None:
        tr = self.trainer
        if tr.running is not None or not tr.jobs or not tr.gpus:
            return
        job = tr.jobs.popleft()
        tr.running = job
        st = self.state
        st.trainer_busy = True
        now = self.now
        gpus = tuple(tr.gpus)
        if isinstance(job, MicroBatchJob):
            st.queued_micro_batches -= 1
            secs = self.cost.train_s(self._charge(list(job.trajectories), self.trajs), len(gpus))
        else:
            secs = self.cost.optimizer_step_s
        tr.step_seconds += secs
        self.gpus.set_runs(tr.runs(gpus), GpuState.TRAIN, now, step=st.version)
        self._later(secs, self._trainer_done, job, gpus)

    def _trainer_done(self, job: MicroBatchJob | OptimizerJob, gpus: tuple[int, ...]) -> None:
        tr = self.trainer
        st = self.state
        now = self.now
        tr.running = None
        st.trainer_busy = False
        self.gpus.set_runs(tr.runs(gpus), GpuState.TRAIN_IDLE, now)
        if isinstance(job, MicroBatchJob):
            tr.accumulated.extend(job.trajectories)
            st.accumulated = tr.accumulated
            self._emit(MicroBatchFinished(job.trajectories))
        else:
            trained = tr.accumulated
            st.queued_optimizer_steps -= 1
            st.mark_trained(trained, st.version)
            stale = max((st.version - st.trajs[t].min_version for t in trained), default=0)
            self._steps.append({
                "version": st.version + 1, "time": now, "trajectories": len(trained),
                "trained_tokens": int(sum(self._trained_tokens(t) for t in trained)),
                "train_seconds": tr.step_seconds, "max_staleness": int(stale),
            })
            tr.step_seconds = 0.0
            tr.accumulated = []
            st.accumulated = tr.accumulated
            st.version += 1
            self._emit(TrainStepFinished(st.version))
            if self.progress is not None:
                self.progress(st.version, st.num_steps, now)
            if st.version >= st.num_steps and not self._done.triggered:
                self._done.succeed()
        leaving = dict(tr.leaving)
        tr.leaving.clear()
        for g, (gid, role) in sorted(leaving.items()):
            self._start_switch((g,), gid, role)
        self._trainer_next()
