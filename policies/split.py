"""Sizing rules for elastic's split between rollout and training, as pure arithmetic on
what the policy knows when it decides (no view, no commands), so each rule can be read,
tested and argued on its own. Today: how much work a batch's rollout engines are spread
for (:func:`work_in_flight`).
"""

from __future__ import annotations


def work_in_flight(batch: int, ahead: int, later: int, older: int) -> int:
    """Trajectories the rollout engines hold at once while a batch of ``batch`` rolls out,
    the figure its per-engine cap spreads evenly: with a batch released ``ahead`` versions
    ahead of the trainer, ``ahead + 1`` batches overlap in steady state (this one and
    ``ahead`` others, older or released while it runs). Near the run's end fewer follow it
    (``later`` < ``ahead``): then it is this batch, the ``later`` ones still to come, and the
    ``older`` trajectories still unfinished -- not ``ahead + 1`` batches that no
    longer exist.

    Why: while engines are on their way to rollout (taken back from the trainer for a new
    batch), the engines already up take no more than an even spread of this work before
    the others arrive. Counting batches that will never come doubled what the one engine up
    could take of a staleness-1 run's last batch: measured on a tool-heavy trace (3
    single-GPU engines, 3 steps of 48 trajectories), 47 of its 48 trajectories rolled out
    on that engine while the engine coming got one and went back to the trainer, 5.0%
    behind the best fixed split; spread for the work there is, 13.8% ahead. With no engine
    coming the steady-state cap stays (a tighter cap with nowhere to spread only makes
    trajectories wait: a 2-engine trace whose trainer kept its engine, 18% slower that
    way), and so does the number of engines a batch takes back (sizing that by this work
    too measured worse on the regime map: up to 4.5% slower at one of twelve points). A
    batch whose older ones are still rolling out counts them, so the spread never drops
    below what is already placed."""
    if later >= ahead:
        return batch * (ahead + 1)
    return batch * (1 + max(0, later)) + older
