"""Length awareness without peeking: how many more turns a live trajectory will take.

A scheduler that knew every trajectory's length could start the longest first, give them
the least crowded engines and cut the right ones (Seer's context-aware scheduling). The
trace's future is not visible to a policy, but two things are, and both predict well on
agent workloads:

* **the group**: the samples of one task have correlated lengths (a hard task is long for
  every sample), so the lengths of a group's *finished* siblings -- and of the task's
  earlier attempts in previous steps -- are the best prior;
* **its own progress**: a trajectory that has already run ``d`` turns is longer than ``d``;
  the prediction is conditional on that (the mean of the prior's lengths above ``d``),
  and with no prior length above ``d`` it grows with ``d`` (a long run keeps running).

The predictor only learns from ``observe`` calls a policy makes on ``TrajectoryFinished``
events; it never reads the trace. :class:`OracleLengths` is the exception, named as one:
it is handed the true lengths by whoever builds it, as an upper reference.
"""

from __future__ import annotations

from collections.abc import Mapping

from rlsched.cluster.ids import TaskId, TrajectoryId


class LengthPredictor:
    """Predicts remaining turns from finished lengths of the same task (and, failing that,
    of every task seen so far), conditional on the turns already done."""

    def __init__(self) -> None:
        self._by_task: dict[TaskId, list[int]] = {}
        self._all = LengthTally()  # every finished length: grows with the run, so it is
        # queried in O(log n), not scanned (a task's own list stays a few samples long)

    def observe(self, task: TaskId, turns: int) -> None:
        """A trajectory of ``task`` ended after ``turns`` turns (done or truncated)."""
        self._by_task.setdefault(task, []).append(turns)
        self._all.add(turns)

    def at_end(self, task: TaskId, turns_done: int) -> bool:
        """Has the trajectory reached the one length every trajectory finished in the run so
        far ended at (no spread at all)? It is then about to end, not longer than all of
        them (:meth:`remaining` cannot tell the two apart: with no prior length above
        ``turns_done`` it predicts as many turns again), and moving its KV would cost more
        than what is left of it saves (traces with no length spread: every trajectory ends
        within a second of the first). The whole run's lengths, not the task's: two or
        three siblings of a long-tailed task often end alike by chance (a rule on the
        task's lengths blocked useful moves at seed scale: staleness 1, 5.2% slower)."""
        return self._all.only_length() == turns_done

    def no_spread_seen(self) -> bool:
        """Has every trajectory finished so far (one at least) had the same length? On a
        trace with no length spread a batch finishes at once, which ``elastic``'s
        ``settle_auto`` trains together."""
        return self._all.only_length() >= 0

    def remaining(self, trajectory: TrajectoryId, task: TaskId, turns_done: int) -> float:
        """Expected turns still to run (> 0 for a trajectory that has not ended).

        The prior is the task's finished lengths if any, else every finished length; the
        answer is the mean of the prior's lengths above ``turns_done``, minus it. When no
        prior length exceeds ``turns_done`` the trajectory is already longer than all of
        them: it is predicted to run as long again as it has (at least one turn). With no
        prior at all every trajectory is predicted alike (one turn), so ordering by it is
        the trace's order.
        """
        prior = self._by_task.get(task)
        if prior:
            return conditional_remaining(prior, turns_done)
        return self._all.remaining(turns_done)


def conditional_remaining(prior: list[int] | tuple[int, ...], turns_done: int) -> float:
    """Mean of ``prior``'s lengths above ``turns_done``, minus ``turns_done`` (see
    :meth:`LengthPredictor.remaining` for the fallbacks)."""
    above = [n for n in prior if n > turns_done]
    if above:
        return sum(above) / len(above) - turns_done
    return float(max(1, turns_done))


class LengthTally:
    """Counts and sums of integer lengths in two Fenwick trees, so that the mean of the
    lengths above ``d`` -- :func:`conditional_remaining` over everything added -- costs
    O(log n) with the same exact integer sums (hence the same float) instead of a scan."""

    def __init__(self) -> None:
        self._size = 64
        self._count = [0] * (self._size + 1)
        self._sum = [0] * (self._size + 1)
        self._n = 0
        self._total = 0
        self._lengths: list[int] = []  # (to rebuild the trees when a length outgrows them)
        self._lo = self._hi = -1  # shortest and longest length added (-1: none yet)

    def add(self, length: int) -> None:
        if length >= self._size:
            while length >= self._size:
                self._size *= 2
            self._count = [0] * (self._size + 1)
            self._sum = [0] * (self._size + 1)
            for n in self._lengths:
                self._insert(n)
        self._lengths.append(length)
        self._insert(length)
        self._n += 1
        self._total += length
        self._lo = length if self._lo < 0 else min(self._lo, length)
        self._hi = max(self._hi, length)

    def only_length(self) -> int:
        """The length every one added has, or -1 (none added, or they differ)."""
        return self._lo if self._lo == self._hi else -1

    def _insert(self, length: int) -> None:
        i = max(length, 0) + 1
        while i <= self._size:
            self._count[i] += 1
            self._sum[i] += length
            i += i & -i

    def remaining(self, turns_done: int) -> float:
        """As :func:`conditional_remaining` over every length added."""
        count, total = self._n, self._total
        i = min(max(turns_done, -1) + 1, self._size)  # subtract the lengths <= turns_done
        while i > 0:
            count -= self._count[i]
            total -= self._sum[i]
            i -= i & -i
        if count:
            return total / count - turns_done
        return float(max(1, turns_done))


class OracleLengths:
    """The true remaining turns, handed in by the composition root (a bench or test that
    read the trace). **Not a prediction**: a policy using it is an upper reference of what
    length awareness could give, never a schedule a real cluster can run."""

    def __init__(self, total_turns: Mapping[TrajectoryId, int]) -> None:
        self._total = dict(total_turns)

    def observe(self, task: TaskId, turns: int) -> None:
        """Nothing to learn: it already knows."""

    def at_end(self, task: TaskId, turns_done: int) -> bool:
        """Never: the reference moves what its true lengths rank, as before."""
        return False

    def no_spread_seen(self) -> bool:
        """Do all trajectories have one length? (It knows them all.)"""
        return len(set(self._total.values())) <= 1

    def remaining(self, trajectory: TrajectoryId, task: TaskId, turns_done: int) -> float:
        total = self._total.get(trajectory)
        if total is None:
            return 1.0
        return float(max(0, total - turns_done)) or 0.5
