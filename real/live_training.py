"""The training side of the live driver: micro-batches, optimizer steps and weight sync.

Training jobs run one at a time on the trainer lane (``live_trainer.py``), in the order the
policy issued them, and only while no membership change is in flight and the trainer holds
at least one GPU. After an optimizer step the lane has already published the new weights,
so the step is reported (``TrainStepFinished``) with them in the object store; a
``SyncWeights`` then sends that version to the engines that stayed in rollout.

Versions here are the driver's (``ClusterState.version``, from 0 in a resumed run); the
rows of the steps table carry the run's absolute version (``host.base`` added).

Everything here runs on the driver's event-loop thread (see ``live_driver.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlsched.cluster.events import WeightsSynced
from rlsched.cluster.ids import GpuState, Role
from rlsched.cluster.loop.trainer_queue import MicroBatchJob, TrainerJob
from rlsched.cluster.record import ids_text

from .samples import micro_batch_samples

if TYPE_CHECKING:
    from .live_driver import LiveDriver


class Training:
    """The live backend's trainer half: runs the driver loop's trainer jobs on the lane
    (the queue, the accumulation and the step rows are the loop's ``TrainerQueue``)."""

    def __init__(self, host: LiveDriver) -> None:
        self.h = host
        self.trained_tokens: dict[str, int] = {}  # tokens each trajectory's samples train
        self._published: dict | None = None  # the lane's report of the last optimizer step

    @property
    def steps(self) -> list[dict]:
        return self.h.loop.trainer.steps  # one row per optimizer step (live_record.STEP_COLUMNS)

    @property
    def job_running(self) -> bool:
        return self.h.loop.trainer.running is not None

    def next_job(self) -> None:
        self.h.loop.trainer.next()

    # ------------------------------------------------------------------- jobs
    def ready(self) -> bool:
        """A job may start: no membership change in flight and the trainer holds a GPU."""
        return not self.h.roles.lane_ops and bool(self.h.st.gpus_in(Role.TRAIN))

    def start_job(self, job: TrainerJob) -> None:
        h = self.h
        st = h.st
        gpus = st.gpus_in(Role.TRAIN)
        h.timeline.set(gpus, GpuState.TRAIN, h.now(), step=st.version)
        if isinstance(job, MicroBatchJob):
            samples, tokens = micro_batch_samples(h.trajs, st, job.trajectories)
            self.trained_tokens.update(tokens)
            h.submit(h.lane.micro_batch(samples), lambda r: self._job_done(job, gpus, r))
        else:
            h.submit(h.lane.optimizer_step(), lambda r: self._job_done(job, gpus, r))

    def _job_done(self, job: TrainerJob, gpus: tuple[int, ...], r: dict) -> None:
        h = self.h
        st = h.st
        h.timeline.set([g for g in gpus if st.roles[g] is Role.TRAIN], GpuState.TRAIN_IDLE, h.now())
        if isinstance(job, MicroBatchJob):
            h.stats["micro_batch"].append(r)
        else:
            h.stats["optimizer"].append(r)
            self._published = r
        h.loop.trainer.job_finished(job, r["seconds"])

    def step_finished(self, trained: list[str]) -> None:
        """The step is counted: its trajectories' environments can go, and the weights the
        lane published with it are recorded."""
        h = self.h
        for tid in trained:
            h.close_traj_env(tid)
        r = self._published
        assert r is not None  # (set by the optimizer job that ended this step)
        h.rec.event(h.now(), "WeightsPublished", version=h.st.version,
                    detail=f"{r['nbytes']} bytes, export {r['export_seconds']:.3f}s")

    # ------------------------------------------------------------------- sync
    def sync(self, engines: tuple[int, ...]) -> None:
        h = self.h
        pub = h.lane.weights.current
        live = [e for e in engines if e in h.rollout.engines]
        version = h.st.version
        h.rec.event(h.now(), "SyncStart", version=version, detail=ids_text(live))
        if pub is None or not live:  # version 0: the engines already hold it
            self._sync_done(live, version)
            return
        target = pub.version - h.base
        t0 = h.now()
        for e in live:
            h.rollout.engines[e].syncing = True
            h.st.engines_[e].syncing = True
            h.rollout.touch(e)
        left = {"n": len(live)}

        def one(r: dict, e: int) -> None:
            left["n"] -= 1
            if e in h.rollout.engines:
                h.rollout.engines[e].version = r["version"]
                h.st.engines_[e].version = r["version"]
            if left["n"] == 0:
                h.stats["sync"].append({"engines": len(live), "seconds": h.now() - t0,
                                        "bytes": pub.nbytes, "put_seconds": pub.put_seconds})
                self._sync_done(live, target)

        for e in live:
            eng = h.rollout.engines[e]
            h.ray_call(eng.actor.update_weights.remote(pub.ref, target), lambda r, e=e: one(r, e), engine=e)

    def _sync_done(self, engines: list[int], version: int) -> None:
        h = self.h
        alive = tuple(e for e in engines if e in h.rollout.engines)
        for e in alive:
            h.rollout.engines[e].syncing = False
            h.st.engines_[e].syncing = False
            h.rollout.touch(e)
            h.rollout.kick(e)
        h.rec.event(h.now(), "SyncEnd", version=version, detail=ids_text(alive))
        h.emit(WeightsSynced(alive, version))
