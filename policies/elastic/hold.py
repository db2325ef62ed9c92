"""``elastic``'s fixed splits: the trainer's side when GPUs do not move between the roles.

* **A reserved trainer** (``train_share``, staleness k >= 1): a trainer of that share of the
  GPUs starts beside the rollout, as async's split does (:meth:`FixedSplit._reserve`).
* **Hold a fixed split when moves cannot pay** (``hold``, staleness k >= 1): moving GPUs to
  the trainer and back costs two role switches and saves at most part of a step's
  training. Once a step's training, measured (its tokens at the measured GPU-seconds per
  token), would take less on every GPU than on half of them by no more than those two
  switches (measured), elastic holds a fixed split, the trainer on half the engines
  rounded up (:func:`~.split.held_trainer_gpus`), until a heavier step lifts it. Small
  clusters with few trajectories a step live here: it closed the three no-harm
  counterexamples (2.3 / 1.0 / 2.0% behind the best async, then 1.0% behind / 2.8% / 0.2%
  ahead); it engaged at no point of the elastic bench (64 and 256 GPUs) nor the regime map.
  Session 13 (traces with no length spread, the ``uniform`` preset): the side rounded up
  rather than down, the bound on what a move saves instead of the whole step, and a held
  trainer giving back what is above its side even after a short rollout took the cases
  more than 1% behind the best async from 15 to 11 and 14 to 7 in two 40-case samples.

:class:`FixedSplit` is a mixin of :class:`~rlsched.policies.elastic.policy.Elastic`, not a
collaborator like the policy's other parts: its three methods are the loop's own, moved
here whole from the former single module (``policies/elastic.py``); they read the loop's ``config``, ``_ahead``, ``_meter``, ``_switches`` and
``_hold`` (the GPUs of the held trainer side, set after each optimizer step from
``_hold_gpus``) and send through its ``_send``.
"""

from __future__ import annotations

from rlsched.cluster.commands import Command
from rlsched.cluster.ids import Drain, Role
from rlsched.cluster.view import ClusterView, TrainerInfo

from ..common import least_loaded_gpus
from .split import at_trainer_floor, held_trainer_gpus


class FixedSplit:
    """The trainer's side of a fixed split: reserved at the start, held when moves cannot pay."""

    def _reserve(self, view: ClusterView) -> int:
        """GPUs (whole engines) the trainer starts with: ``train_share`` with staleness (at
        least one engine, or its floor), or none with ``train_share=0`` (then the engines
        rollout frees form it once there is work: on short-sequence traces a reserved
        trainer idled ~25% of the GPUs while the first batches rolled out, but where
        training is heavy -- long sequences, a high memory floor -- starting without one
        measured up to 23% slower, so 0.25 is the default)."""
        if not self._ahead or view.num_steps < 2 or self.config.train_share == 0:
            return 0
        engines = view.num_gpus // view.tp
        gpus = min(engines - 1, max(1, round(self.config.train_share * engines))) * view.tp
        # (0 when no room is left for both: the trainer forms when the rollout frees it)
        return at_trainer_floor(gpus, view.trainer().min_gpus, view.tp, view.num_gpus - view.tp)

    def _hold_gpus(self, view: ClusterView) -> int:
        """``hold``: GPUs of the trainer's side of a fixed split to hold, or 0 to go on moving
        GPUs. Moving GPUs to the trainer and back costs two role switches, and the most it
        can save is what the step's training (its tokens at the measured GPU-seconds per
        token) would take less on every GPU than on the held side; once that is no more than
        those two switches (measured), no move can repay itself. Elastic is then a fixed
        split, its trainer holding half the engines rounded up (at least its memory floor):
        async's makespan over its ``rollout_fraction`` is flat in the middle and steep at the
        ends (a small long-tailed case, seed 1: 348.9 s at 0.25, 353.7 s at 0.5, 397.1 s at
        0.75; seed 16: 410.2 / 405.1 / 435.7 s), and this regime is the one whose rollout is
        the tail's latency rather than its GPUs (the arithmetic, and why rounded up:
        :func:`~.split.held_trainer_gpus`). Measured after each optimizer step from this
        run's events only (the workload drifts: a heavier step lifts the hold). A held
        trainer above its side gives the rest back when a batch is released, even when the
        last rollout was too short to repay a switch (``_reclaim``): the side is for every
        later batch, not only this one."""
        if not self.config.hold or not self._ahead or view.num_steps < 2:
            return 0
        m = self._meter
        work = m.step_train_gpu_s()
        if work is None or m.switch_s is None:
            return 0
        return held_trainer_gpus(work, m.switch_s, view.num_gpus, view.tp, view.trainer().min_gpus)

    def _grow_to_hold(self, view: ClusterView, tr: TrainerInfo) -> list[Command]:
        """A held split whose trainer is short of its side by whole engines takes them from
        rollout, the least loaded first (their live trajectories migrate with ``drain``),
        keeping at least ``min_engines`` rolling out. An empty trainer grows too: a batch
        released while no engine rolled out takes every GPU back (``_reclaim``), and a held
        split, whose consolidation waits for this growth, would otherwise never train again
        (a stall, found on a 2-engine trace with no length spread)."""
        if not self._hold:
            return []
        have = sum(1 for g in tr.gpus if g not in self._switches.to_rollout) + self._switches.to_trainer(view)
        ids = view.engines()
        n = min((self._hold - have) // view.tp, len(ids) - self.config.min_engines)
        if n <= 0:
            return []
        gpus = least_loaded_gpus(view, view.engine_loads(), n)
        return self._send(view, gpus, Role.TRAIN, Drain(self.config.drain))
