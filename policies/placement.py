"""Late binding inside a policy: a queue of released trajectories placed on engines one by
one, longest predicted first, never more than a cap per engine.

A ``Dispatch`` binds a trajectory to an engine for good (the contract moves it only when
its engine leaves rollout). Dispatching a whole batch at once therefore fixes, at the one
moment nothing is known yet, which trajectories share an engine -- and an engine's decode
slows with every sequence and every token of KV it holds, so a long trajectory packed
with others is the step's tail. Holding the batch in the policy instead, and placing a
trajectory only when an engine has room under ``cap``, lets

* the trajectories predicted longest go first, to the least loaded engines;
* engines that join rollout later (taken back from the trainer) get work of the batch;
* an engine that empties take the next queued trajectory instead of idling.

Older steps go before newer ones: the trainer needs them first.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from rlsched.cluster.commands import Command, Dispatch
from rlsched.cluster.ids import EngineId, TrajectoryId, TrajStatus
from rlsched.cluster.view import ClusterView

Predict = Callable[[TrajectoryId, str, int], float]


class LateQueue:
    """Trajectories released for rollout and not yet placed, by step."""

    def __init__(self) -> None:
        self._steps: dict[int, list[TrajectoryId]] = {}

    def __len__(self) -> int:
        return sum(len(v) for v in self._steps.values())

    def __bool__(self) -> bool:
        return any(self._steps.values())

    def add(self, step: int, tids: tuple[TrajectoryId, ...] | list[TrajectoryId], *, front: bool = False) -> None:
        q = self._steps.setdefault(step, [])
        fresh = [t for t in tids if t not in q]
        self._steps[step] = fresh + q if front else q + fresh

    def pending(self, step: int) -> int:
        return len(self._steps.get(step, ()))

    def steps(self) -> list[int]:
        return sorted(s for s, q in self._steps.items() if q)

    def place(self, view: ClusterView, cap: int, min_version: Callable[[int], int],
              predict: Predict | None, hold: int = 0) -> list[Command]:
        """Dispatch queued trajectories to active engines whose load is below ``cap`` and
        whose weights are at least ``min_version(step)``, oldest step first and, within a
        step, longest predicted first (ties: queue order), each to the least loaded such
        engine (ties: lowest id). The ``hold`` longest predicted of the oldest step stay
        queued: they wait for empty engines on their way (switching into rollout) instead
        of joining a crowded one now."""
        if not self:
            return []
        cur = {e: load for e, load in view.engine_loads() if load < cap}
        if not cur:
            return []
        versions = {e: view.engine(e).version for e in cur}
        out: dict[EngineId, list[TrajectoryId]] = {}
        for step in self.steps():
            floor = min_version(step)
            heap = [(load, e) for e, load in cur.items() if load < cap and versions[e] >= floor]
            if not heap:
                continue
            heapq.heapify(heap)
            queue = self._steps[step]
            order = list(range(len(queue)))
            if predict is not None:
                infos = [view.trajectory(t) for t in queue]
                keys = [predict(t, i.task_id, i.turns_done) for t, i in zip(queue, infos, strict=True)]
                order.sort(key=lambda j: -keys[j])
            placed: set[int] = set()
            if hold and predict is not None:
                order, hold = order[hold:], 0
            for j in order:
                if not heap:
                    break
                tid = queue[j]
                placed.add(j)
                if view.status(tid) not in (TrajStatus.PENDING, TrajStatus.INTERRUPTED):
                    continue  # (dispatched meanwhile by someone else: forget it)
                load, e = heap[0]
                out.setdefault(e, []).append(tid)
                cur[e] = load + 1
                if load + 1 < cap:
                    heapq.heapreplace(heap, (load + 1, e))
                else:
                    heapq.heappop(heap)
            self._steps[step] = [t for j, t in enumerate(queue) if j not in placed]
        return [Dispatch(tuple(ts), engine=e) for e, ts in sorted(out.items())]


def per_engine_cap(batch_size: int, engines: int, pack: float) -> int:
    """Trajectories an engine may hold: ``pack`` times an even spread of one batch over
    every engine of the cluster (at least one)."""
    return max(1, math.ceil(pack * batch_size / max(1, engines)))
