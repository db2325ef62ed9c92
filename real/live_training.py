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

from collections import deque
from typing import TYPE_CHECKING

from rlsched.cluster.events import MicroBatchFinished, TrainStepFinished, WeightsSynced
from rlsched.cluster.ids import GpuState, Role

from .live_trace import ids_text
from .samples import micro_batch_samples

if TYPE_CHECKING:
    from .live_driver import LiveDriver


class Training:
    def __init__(self, host: LiveDriver) -> None:
        self.h = host
        self._jobs: deque[tuple[str, tuple[str, ...]]] = deque()
        self.job_running = False
        self._accumulated: list[str] = []
        self._step_seconds = 0.0
        self.steps: list[dict] = []  # one row per optimizer step (live_record.STEP_COLUMNS)
        self.trained_tokens: dict[str, int] = {}

    # ------------------------------------------------------------------- jobs
    def queue_micro_batch(self, tids: tuple[str, ...]) -> None:
        for tid in tids:
            self.h.st.trajs[tid].in_micro_batch = True
        self._jobs.append(("micro", tuple(tids)))
        self.h.st.queued_micro_batches += 1

    def queue_optimizer_step(self) -> None:
        self._jobs.append(("optimizer", ()))
        self.h.st.queued_optimizer_steps += 1

    def next_job(self) -> None:
        h = self.h
        st = h.st
        if self.job_running or not self._jobs or h.roles.lane_ops or not st.gpus_in(Role.TRAIN):
            return
        kind, tids = self._jobs.popleft()
        self.job_running = True
        st.trainer_busy = True
        gpus = st.gpus_in(Role.TRAIN)
        h.timeline.set(gpus, GpuState.TRAIN, h.now(), step=st.version)
        if kind == "micro":
            st.queued_micro_batches -= 1
            samples, tokens = micro_batch_samples(h.trajs, st, tids)
            self.trained_tokens.update(tokens)
            h.submit(h.lane.micro_batch(samples), lambda r: self._job_done(kind, tids, gpus, r))
        else:
            h.submit(h.lane.optimizer_step(), lambda r: self._job_done(kind, tids, gpus, r))

    def _job_done(self, kind: str, tids: tuple[str, ...], gpus: tuple[int, ...], r: dict) -> None:
        h = self.h
        st, now = h.st, h.now()
        self.job_running = False
        st.trainer_busy = False
        self._step_seconds += r["seconds"]
        h.timeline.set([g for g in gpus if st.roles[g] is Role.TRAIN], GpuState.TRAIN_IDLE, now)
        if kind == "micro":
            h.stats["micro_batch"].append(r)
            self._accumulated.extend(tids)
            st.accumulated = self._accumulated
            h.emit(MicroBatchFinished(tids))
        else:
            self._step_done(r, now)
        h.roles.release_leaving()
        self.next_job()

    def _step_done(self, r: dict, now: float) -> None:
        h = self.h
        st = h.st
        h.stats["optimizer"].append(r)
        trained = self._accumulated
        st.queued_optimizer_steps -= 1
        st.mark_trained(trained, st.version)
        for tid in trained:
            h.close_traj_env(tid)
        stale = max((st.version - st.trajs[t].min_version for t in trained if st.trajs[t].min_version >= 0),
                    default=0)
        self.steps.append({
            "version": h.base + st.version + 1, "time": now, "trajectories": len(trained),
            "trained_tokens": int(sum(self.trained_tokens.get(t, 0) for t in trained)),
            "train_seconds": self._step_seconds, "max_staleness": int(stale),
            **r.pop("learning", {}),  # live_record.LEARNING_COLUMNS (the lane's per-step figures)
        })
        self._step_seconds = 0.0
        self._accumulated = []
        st.accumulated = self._accumulated
        st.version += 1
        h.rec.event(now, "WeightsPublished", version=st.version,
                    detail=f"{r['nbytes']} bytes, export {r['export_seconds']:.3f}s")
        h.emit(TrainStepFinished(st.version))
        if h.progress is not None:
            h.progress(h.base + st.version, h.base + st.num_steps, now)

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
