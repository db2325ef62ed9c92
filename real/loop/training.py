"""The training side of the live driver: micro-batches, optimizer steps and weight sync.

Training jobs run one at a time on the trainer lane (``train/lane.py``), in the order the
policy issued them, and only while no membership change is in flight and the trainer holds
at least one GPU. After an optimizer step the lane has already published the new weights,
so the step is reported (``TrainStepFinished``) with them in the object store; a
``SyncWeights`` then sends that version to the engines that stayed in rollout.

Versions here are the driver's (``ClusterState.version``, from 0 in a resumed run); the
rows of the steps table carry the run's absolute version (``host.base`` added).

Everything here runs on the driver's event-loop thread (see ``loop/driver.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlsched.cluster.events import WeightsSynced
from rlsched.cluster.ids import GpuState, Role
from rlsched.cluster.loop.trainer_queue import MicroBatchJob, TrainerJob
from rlsched.cluster.record import ids_text
from rlsched.real.loop.fault_inject import (
    Failed,
    failing_sync,
    outcome,
    raise_failure,
    sync_should_fail,
    trainer_job_started,
)
from rlsched.real.train.samples import GroupHold

if TYPE_CHECKING:
    from rlsched.real.loop.driver import LiveDriver


class Training:
    """The live backend's trainer half: runs the driver loop's trainer jobs on the lane
    (the queue, the accumulation and the step rows are the loop's ``TrainerQueue``)."""

    def __init__(self, host: LiveDriver) -> None:
        self.h = host
        self.trained_tokens: dict[str, int] = {}  # tokens each trajectory's samples train
        self._published: dict | None = None  # the lane's report of the last optimizer step
        # for a [faults] trainer crash (loop.fault_inject): the step's finished micro-batches
        # (re-run after it) with their GPU-seconds, the running job (its GPUs, its start),
        # and which trainer incarnation a job ran on (a crashed one's late reply is void)
        self._done_micro: list[tuple[MicroBatchJob, float]] = []
        self._running: tuple[tuple[int, ...], float] | None = None
        self._epoch = 0
        # trajectories sent to the trainer whose GRPO group has members still generating:
        # trained once the group settles, at the latest with the optimizer step (samples.py)
        self.hold = GroupHold()

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
        epoch, self._running = self._epoch, (gpus, h.now())
        if isinstance(job, MicroBatchJob):
            samples, tokens = self.hold.take(h.trajs, st, job.trajectories, processor=h.lane.processor)
            self.trained_tokens.update(tokens)
            fut = h.lane.micro_batch(samples)
        else:
            fut = h.lane.optimizer_step(self.hold.flush(h.trajs, st, processor=h.lane.processor))
            if h.lane.processor:
                self.trained_tokens.update(self.hold.flushed_tokens)
        h.submit(outcome(fut), lambda r: self._job_done(job, gpus, r, epoch))
        trainer_job_started(h)  # an armed [faults] trainer fault crashes this job

    def _job_done(self, job: TrainerJob, gpus: tuple[int, ...], r: Any, epoch: int) -> None:
        h = self.h
        if epoch != self._epoch:
            return  # ran on a trainer that crashed since: re-queued by abort_step
        if isinstance(r, Failed):
            raise_failure(r.exc)
        self._running = None
        st = h.st
        h.timeline.set([g for g in gpus if st.roles[g] is Role.TRAIN], GpuState.TRAIN_IDLE, h.now())
        if isinstance(job, MicroBatchJob):
            h.stats["micro_batch"].append(r)
            self._done_micro.append((job, r["seconds"] * len(gpus)))
        else:
            if "flushed" in r:  # the held samples trained just before the update
                h.stats["micro_batch"].append(r.pop("flushed"))
            h.stats["optimizer"].append(r)
            self._published = r
            self._done_micro = []
        h.loop.trainer.job_finished(job, r["seconds"])

    def abort_step(self) -> float:
        """A ``[faults]`` trainer crash (``loop.fault_inject``): the step's gradients are gone.
        The loop's trainer queue re-queues its finished micro-batches and the running job, in
        order, ahead of queued work (as the simulator's fault path does); the running job's
        reply is void. Returns the trainer GPU-seconds lost (measured)."""
        h = self.h
        st, now = h.st, h.now()
        lost = sum(secs for _, secs in self._done_micro)
        elapsed = None
        if self._running is not None and h.loop.trainer.running is not None:
            gpus, t0 = self._running
            elapsed = now - t0
            lost += elapsed * len(gpus)
            h.timeline.set([g for g in gpus if st.roles[g] is Role.TRAIN], GpuState.TRAIN_IDLE, now)
        h.loop.trainer.requeue(elapsed, [job for job, _ in self._done_micro])
        self._running = None
        self._done_micro = []
        self.hold.clear()  # the re-run micro-batches hold their trajectories again
        self._epoch += 1
        return lost

    def step_finished(self, trained: list[str]) -> None:
        """The step is counted: its trajectories' environments can go, and the weights the
        lane published with it are recorded."""
        h = self.h
        for tid in trained:
            h.close_traj_env(tid)
        r = self._published
        assert r is not None  # (set by the optimizer job that ended this step)
        # the lane's per-step learning figures join the step row the loop just wrote
        # (train.learning_figures.LEARNING_COLUMNS), before anything reads it
        h.loop.trainer.steps[-1].update(r.pop("learning", {}))
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
        if sync_should_fail(h):  # an armed [faults] sync fault: this sync fails, for real
            failing_sync(h, live, pub, target, t0)
            return
        left = {"n": len(live)}

        def one(r: Any, e: int) -> None:
            left["n"] -= 1
            if isinstance(r, Failed):  # the engine died mid-sync: the others' sync still ends
                h.roles.engine_failed(e, r.exc)
            elif e in h.rollout.engines:
                h.rollout.engines[e].version = r["version"]
                h.st.engines_[e].version = r["version"]
            if left["n"] == 0:
                h.stats["sync"].append({"engines": len(live), "seconds": h.now() - t0,
                                        "bytes": pub.nbytes, "put_seconds": pub.put_seconds})
                self._sync_done(live, target)

        for e in live:
            eng = h.rollout.engines[e]
            h.submit(outcome(eng.actor.update_weights.remote(pub.ref, target).future()), lambda r, e=e: one(r, e))

    def _sync_done(self, engines: list[int], version: int) -> None:
        h = self.h
        alive = tuple(e for e in engines if e in h.rollout.engines)
        for e in alive:
            h.rollout.engines[e].syncing = False
            h.st.engines_[e].syncing = False
            h.rollout.touch(e)
            h.rollout.kick(e)
        if alive and h.st.unbound:  # (work the old weights could not take may be waiting)
            h.rollout.place_all()
        h.rec.event(h.now(), "SyncEnd", version=version, detail=ids_text(alive))
        h.emit(WeightsSynced(alive, version))
