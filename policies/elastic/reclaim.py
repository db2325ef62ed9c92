"""``elastic`` takes trainer GPUs back to rollout for queued work (:meth:`Reclaim._reclaim`).

* **Take GPUs back when a batch needs them.** When a new batch is released and its work
  waits in the queue with no engine to go to, whole engines come back from the trainer, as
  many as the queue needs at the per-engine cap (GPUs sent away while a micro-batch runs
  leave when it ends). With staleness and a backlog to train, the trainer keeps what it
  needs to train it (:meth:`~rlsched.policies.elastic.training.Training.keep`); a held
  split (:mod:`.hold`) goes back to its two sides; with no engine rolling out at all the
  trainer is emptied (the queue would wait forever), GPUs short of a whole engine going
  idle, never leaving the trainer below its memory floor in between.
* **Only when it pays.** Once measured, a batch whose rollout is over before an engine
  taken back would repay its switch there and back (:meth:`Reclaim._pays`) takes no GPU
  back: its queue goes to the engines already rolling out.

:class:`Reclaim` is a mixin of :class:`~rlsched.policies.elastic.policy.Elastic`, as
:class:`~rlsched.policies.elastic.hold.FixedSplit` is, rather than a collaborator like
:mod:`.switches` or :mod:`.tail`: the rule reads nine parts of the loop's state (``config``,
``_queue``, ``_switches``, ``_meter``, ``_training``, ``_rolling``, ``_hold``, ``_cap``,
``_even``), changes one of them (``_cap``, opened up when moves do not pay) and sends
through the loop's ``_send`` (which records each switch); a collaborator would take all of
that as arguments and hand the cap back, for no state of its own. The method is the loop's
own, moved here from ``policy.py``; the order of the Reassigns that empty the trainer is
:func:`~rlsched.policies.common.leave_trainer`'s rule.
"""

from __future__ import annotations

import math

from rlsched.cluster.commands import Command
from rlsched.cluster.view import ClusterView, TrainerInfo

from ..common import leave_trainer


class Reclaim:
    """Trainer GPUs back to rollout while queued work has no engine to go to."""

    def _reclaim(self, view: ClusterView, tr: TrainerInfo) -> list[Command]:
        """Bring trainer GPUs back to rollout while queued work has no engine to go to."""
        if not self._queue or not tr.gpus:
            return []
        tp = view.tp
        queued = len(self._queue)  # what the engines up now could not take
        if queued <= 0:
            return []
        stranded = not view.engines() and not self._switches.coming(view)
        if not stranded and not self._hold and self._meter.rollout_s is not None and not self._pays(self._meter.rollout_s):
            # a batch's rollout is over before an engine taken back would have paid for
            # its switch: the queue goes to the engines already rolling out (not in a held
            # split: its trainer gives back what is above its side, for every later batch)
            self._cap = 1 << 30
            return []
        coming = self._switches.coming(view) // tp
        want = math.ceil(queued / min(self._cap, self._even)) - coming  # engines it still needs
        if want <= 0:
            return []
        keep = self._training.keep(view, self._rolling()) if self.config.staleness else 0
        if self._hold:
            keep = self._hold  # a held split: the trainer keeps its side
        if not view.engines() and not coming:
            keep = 0  # no engine rolls out: the queue would wait forever
        # (GPUs already sent away stay in TRAIN until their micro-batch ends: not twice. GPUs
        # of a group still switching to the trainer are in it already and count: left out,
        # the trainer kept them below its floor, which the contract refuses -- the fault
        # sweep, 32 GPUs, seed 50)
        arriving = {g for k in self._switches.to_train for g in k}
        free = tuple(g for g in tr.gpus if g not in self._switches.moving or g in arriving)
        spare = (len(free) - keep) // tp
        if spare <= 0:
            if view.engines() or coming or not free:
                return []
            # no engine rolls out and the trainer holds less than a whole engine: it is
            # emptied -- its GPUs may complete engines with idle partners back from failures
            # (leave_trainer), and else the queue waits forever (a stall under the fault
            # sweep, 8 GPUs of tp 4, flat model, seed 2: GPUs 1, 5 and 7 trained while their
            # five partners idled)
            take, left = free, 0
        else:
            n = spare if self._hold else min(spare, want)  # (a held split: back to its sides)
            left = len(free) - n * tp
            take = free[len(free) - n * tp:]
        if 0 < left < tr.min_gpus:  # never shrink the trainer below its floor (refused)
            if keep:
                n = (len(free) - tr.min_gpus) // tp
                if n <= 0:
                    return []
                take = free[len(free) - n * tp:]
            else:  # empty it (GPUs short of a whole engine go IDLE: leave_trainer)
                take = free
        # whole engines to rollout, the rest idle, never leaving the trainer below its floor
        # in between (the order: leave_trainer)
        out: list[Command] = []
        for c in leave_trainer(view, take):
            out += self._send(view, c.gpus, c.role)
        return out

    def _pays(self, seconds: float) -> bool:
        """Is moving GPUs for work of ``seconds`` worth a switch there and back (as far as
        measured: before the first switch was timed, it is)?"""
        sw = self._meter.switch_s
        return sw is None or seconds > 2.0 * sw

