"""The trainer as the live driver drives it: one ordered lane of blocking operations.

Why a lane: membership changes (a role change resizing the data-parallel group) and
training jobs (micro-batches, optimizer steps) must never overlap, and must happen in the
order the policy asked for them. One worker thread runs them in FIFO order while the
driver's event loop keeps serving engines and environments.

When the policy takes every GPU away from training (colocated switches the whole cluster
to rollout after each step) the group is checkpointed and shut down -- its weights and
AdamW state go to disk, as an offload would -- and restored when GPUs come back.
After every optimizer step the new weights are exported and published to Ray's object
store (:class:`~rlsched.real.train.weights.WeightStore`) before the step is reported, so a
``SyncWeights`` or a new engine always finds the version the trainer holds.

With ``checkpoints`` set, every optimizer step also saves the trainer (weights, AdamW state,
version) into that step's checkpoint folder before the step is reported, so the driver can
make the step durable (``checkpoint.py``); ``restore`` is such a file, loaded when the
trainer first starts in a resumed run.

The lane also sums each step's learning figures (``learning_figures.StepLearning``: rewards
of the trained samples, loss, KL to the starting policy, token staleness, clipping,
importance ratios) and returns them with the optimizer step as ``learning``, a dict of
``LEARNING_COLUMNS``; the training side merges it into the step's row.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rlsched.real.train.learning_figures import StepLearning
from rlsched.real.train.weights import WeightStore


class TrainerLane:
    def __init__(self, model_dir: str, *, seed: int, lr: float, threads: int, ckpt_dir: Path,
                 weights: WeightStore, checkpoints: Callable[[int], Path] | None = None,
                 restore: Path | None = None, version: int = 0, processor: bool = False) -> None:
        self.model_dir = model_dir
        self.processor = processor  # the trajectory processor: groups packed as prefix trees
        self.seed, self.lr, self.threads = seed, lr, threads
        self.ckpt = ckpt_dir / "trainer.pt"  # the offload file
        self.weights = weights
        self.checkpoints = checkpoints  # version -> that step's checkpoint folder
        self.restore = restore
        self.group: Any = None  # rlsched.real.train.trainer.TrainerGroup
        self.has_ckpt = False
        self.pending_tokens = 0
        self.version = version
        self.first_version = version  # a restart before any step here starts from these weights
        self.learning = StepLearning()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rlsched-trainer")

    # ----------------------------------------------------------- membership
    def set_slots(self, slots: list[int]) -> Future[dict]:
        return self._pool.submit(self._set_slots, list(slots))

    def _set_slots(self, slots: list[int]) -> dict:
        t0 = time.perf_counter()
        action = "resize"
        if not slots:
            if self.group is not None:
                self.group.save_checkpoint(self.ckpt)
                self.group.shutdown()
                self.group, self.has_ckpt, action = None, True, "offload"
        elif self.group is None:
            from rlsched.real.train.trainer import TrainerGroup

            self.group = TrainerGroup(self.model_dir, slots, seed=self.seed, lr=self.lr,
                                      threads_per_rank=self.threads, processor=self.processor)
            action = "start"
            if self.has_ckpt or self.restore is not None:
                self.group.load_checkpoint(self.ckpt if self.has_ckpt else self.restore)
                self.restore, action = None, "restore"  # later starts load the offload file
        else:
            self.group.resize(slots)
        return {"action": action, "world": len(slots), "seconds": time.perf_counter() - t0}

    # ------------------------------------------------------------- a crash
    def crash(self) -> int:
        """Kill the trainer's ranks now (``[faults]`` trainer, from the driver's thread); the
        job running on them fails. Returns the ranks killed (0: no trainer running)."""
        group = self.group
        return group.kill_ranks() if group is not None else 0

    def restart(self, delay: float, version: int, stopping: Any, slots: list[int] | None = None) -> Future[dict]:
        """After a crash: in lane order, drop the dead group, wait ``delay`` seconds (the
        schedule's ``restart_s``; ``stopping.wait``), start the ranks again on the same
        slots and load the weights and AdamW state of ``version`` -- the last completed
        optimizer step, saved in its checkpoint folder (the model's own weights before the
        first step). The step's gradients are gone; the driver re-runs its micro-batches.
        ``slots``: the slots to restart on (a failed trainer GPU left them); none left, the
        trainer starts from that checkpoint when GPUs come back (``set_slots``)."""
        return self._pool.submit(self._restart, delay, version, stopping, slots)

    def _restart(self, delay: float, version: int, stopping: Any, slots: list[int] | None) -> dict:
        from rlsched.cluster.errors import LiveBackendError

        t0 = time.perf_counter()
        if slots is None:
            slots = list(self.group.slots) if self.group is not None else []
        if self.group is not None:
            self.group.shutdown()
            self.group = None
        stopping.wait(delay)
        self.pending_tokens = 0
        self.version = version
        source = self.checkpoints(version) / "trainer.pt" if self.checkpoints is not None else None
        if (source is None or not source.exists()) and version != self.first_version:
            raise LiveBackendError(f"trainer restart: no checkpoint of version {version} to restart from")
        if not slots:  # the next start (set_slots) loads the last step, not an older offload
            self.has_ckpt = False
            self.restore = source if source is not None and source.exists() else None
        else:
            from rlsched.real.train.trainer import TrainerGroup

            self.group = TrainerGroup(self.model_dir, slots, seed=self.seed, lr=self.lr,
                                      threads_per_rank=self.threads, processor=self.processor)
            if source is not None and source.exists():
                self.group.load_checkpoint(source)
        return {"action": "restart", "world": len(slots), "seconds": time.perf_counter() - t0,
                "version": version}

    # ----------------------------------------------------------------- jobs
    def micro_batch(self, samples: list[Any]) -> Future[dict]:
        return self._pool.submit(self._micro_batch, samples)

    def _micro_batch(self, samples: list[Any]) -> dict:
        t0 = time.perf_counter()
        if not samples:
            return {"samples": 0, "tokens": 0, "trained_tokens": 0, "seconds": 0.0}
        stats = self.group.train_micro_batch(samples)
        self.pending_tokens += int(stats.get("trained_tokens", 0))
        self.learning.add(samples, stats)
        stats["seconds"] = time.perf_counter() - t0
        stats["version"] = self.version  # the weights it was trained at: its step's, for the record
        return stats

    def optimizer_step(self) -> Future[dict]:
        return self._pool.submit(self._optimizer_step)

    def _optimizer_step(self) -> dict:
        t0 = time.perf_counter()
        empty = self.pending_tokens == 0
        if not empty:
            self.group.optimizer_step()
        # The lane's count is the run's version: a step in which nothing was trained (no
        # generated token kept) leaves the weights as they are but still counts.
        self.version += 1
        self.pending_tokens = 0
        t1 = time.perf_counter()
        pub = self.weights.publish(self.group.export_hf_state_dict(), self.version)
        t2 = time.perf_counter()
        if self.checkpoints is not None:
            target = self.checkpoints(self.version) / "trainer.pt"
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name("trainer.pt.tmp")
            self.group.save_checkpoint(tmp)
            os.replace(tmp, target)
        return {
            "version": self.version, "empty": empty, "step_seconds": t1 - t0,
            "export_seconds": t2 - t1, "nbytes": pub.nbytes,
            "checkpoint_seconds": time.perf_counter() - t2, "seconds": time.perf_counter() - t0,
            "learning": self.learning.row(),
        }

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.group is not None:
            try:
                self.group.shutdown()
            finally:
                self.group = None
