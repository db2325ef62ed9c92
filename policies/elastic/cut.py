"""``elastic``'s cut: which trajectories each step trains, once the tail may be cut.

* **Cut the tail, if asked** (``cut``, staleness k >= 1 only): the step's optimizer step
  need not wait for its last few trajectories; they are trained with the next step (and
  batches are released one version later, so that stays within k).

Without a cut a step trains its batch. :class:`CutLedger` records the cuts and answers,
for the loop and the trainer, what a step trains given them: its batch, less the
trajectories cut from it, plus those cut from the step before.
"""

from __future__ import annotations

from rlsched.cluster.ids import TrajStatus
from rlsched.cluster.view import ClusterView

from ..placement import LateQueue

_OPEN = (TrajStatus.PENDING, TrajStatus.QUEUED, TrajStatus.RUNNING, TrajStatus.INTERRUPTED)


class CutLedger:
    """The cuts made so far: step -> its trajectories trained with the step after it."""

    def __init__(self) -> None:
        self._cut_from: dict[int, frozenset[str]] = {}

    def cut_from(self, s: int) -> frozenset[str]:
        """The trajectories cut from step ``s`` (trained with step s+1)."""
        return self._cut_from.get(s, frozenset())

    def ready(self, view: ClusterView, s: int) -> tuple[str, ...]:
        """Finished trajectories the trainer's step ``s`` trains and has not been sent: the
        step's own, less those cut from it, and those cut from step s-1."""
        cut, carried = self.cut_from(s), self.cut_from(s - 1)
        stopped = set(view.interrupted(s))
        ready = view.finished(s)
        if stopped or cut:  # (most asks: nothing stopped, nothing cut, nothing to filter)
            ready = tuple(t for t in ready if t not in stopped and t not in cut)
        if carried:
            stopped = set(view.interrupted(s - 1))
            ready += tuple(t for t in view.finished(s - 1) if t in carried and t not in stopped)
        return ready

    def size(self, view: ClusterView, s: int) -> int:
        """How many trajectories step ``s`` trains (its batch, less and plus the cut)."""
        return len(view.batch(s)) - len(self.cut_from(s)) + len(self.cut_from(s - 1))

    def unfinished(self, view: ClusterView, s: int, queue: LateQueue) -> int:
        """Trajectories step ``s`` trains that have not finished (or wait in ``queue`` to
        be placed)."""
        n = view.unfinished(s) + queue.pending(s)
        if self._cut_from.get(s) or self._cut_from.get(s - 1):
            live = (TrajStatus.PENDING, TrajStatus.QUEUED, TrajStatus.RUNNING)
            n -= sum(1 for t in self.cut_from(s) if view.status(t) in live)
            n += sum(1 for t in self.cut_from(s - 1) if view.status(t) in live)
        return n

    def cut(self, view: ClusterView, s: int, share: float, staleness: int, sent: int) -> tuple[str, ...]:
        """Cut the tail of the trainer's step ``s`` (``cut``), called once the trainer has
        trained all of the step it can (``sent`` of its trajectories so far): when only a
        few of its trajectories are still live (no more than ``share`` of its batch), those
        few are trained with the next step instead, so the optimizer step, the new weights
        and the next batch's release do not wait for them. They are not stopped: they keep
        their engine, KV and tokens and take the new weights with their engine (the
        driver charges the sync as for every engine); with ``cut_stop`` the loop interrupts
        them keeping their finished turns and they are resumed with the next step's batch
        (APRIL / Kimi k1.5's partial rollout). Legal only if the version that trains them
        (step+1) is within ``staleness`` of their oldest token; one cut from the previous
        step is never cut again (it is trained now). Returns the cut (recorded), or ()."""
        if s in self._cut_from or s + 1 >= view.num_steps:
            return ()
        batch = view.batch(s)
        live = tuple(t for t in batch if view.status(t) in (TrajStatus.QUEUED, TrajStatus.RUNNING))
        if not live or len(live) > share * len(batch):
            return ()
        carried = self.cut_from(s - 1)
        if sent <= len(carried):
            return ()  # none of the step's own trained yet: a cut would move the whole step
        if any(view.status(t) in _OPEN for t in carried):  # (interrupted: waits to resume)
            return ()  # the step waits for the tail it carries anyway: cutting gains nothing
        oldest = min(view.trajectory(t).min_version for t in live)
        if oldest >= 0 and s + 1 - oldest > staleness:
            return ()  # (batches are released so that this does not happen; a safety net)
        self._cut_from[s] = frozenset(live)
        return live
