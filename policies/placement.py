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
from collections.abc import Callable, Sequence

from rlsched.cluster.commands import Command, Dispatch
from rlsched.cluster.ids import EngineId, GpuId, TrajectoryId, TrajStatus
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
              predict: Predict | None, hold: int = 0,
              skip: frozenset[EngineId] = frozenset(), unpinned: bool = False) -> list[Command]:
        """Dispatch queued trajectories to active engines whose load is below ``cap`` and
        whose weights are at least ``min_version(step)``, oldest step first and, within a
        step, longest predicted first (ties: queue order), each to the least loaded such
        engine (ties: lowest id). The ``hold`` longest predicted of the oldest step stay
        queued: they wait for empty engines on their way (switching into rollout) instead
        of joining a crowded one now. Engines in ``skip`` (leaving rollout in the same
        decision) take nothing. ``unpinned``: the same trajectories, in the same order, go
        to the cluster's queue instead of the engines chosen (the driver binds each where KV
        is free and requeues one an engine preempts)."""
        if not self:
            return []
        cur = {e: load for e, load in view.engine_loads() if load < cap and e not in skip}
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
        if unpinned:
            return [Dispatch(tuple(t for _, ts in sorted(out.items()) for t in ts))] if out else []
        return [Dispatch(tuple(ts), engine=e) for e, ts in sorted(out.items())]


def per_engine_cap(batch_size: int, engines: int, pack: float) -> int:
    """Trajectories an engine may hold: ``pack`` times an even spread of one batch over
    every engine of the cluster (at least one)."""
    return max(1, math.ceil(pack * batch_size / max(1, engines)))


# ------------------------------------------------------------------ topology
# Where GPUs are matters once a cost model has NVLink domains (``view.gpus_per_node``):
# the trainer's gradient reduction stays on NVLink only while it fits one domain, GPUs
# that join it reshard over NVLink only from domains it already holds, and an engine
# next to a trainer GPU syncs its weights over NVLink. These orderings only break ties
# of the choices a policy already makes (least loaded engines go, any trainer GPUs come
# back), so on a flat fabric (``gpus_per_node`` 0) they give the old orders unchanged.


def _domain(view: ClusterView, gpu: int) -> int:
    n = view.gpus_per_node
    return gpu // n if n > 0 else 0


def _trainer_per_domain(view: ClusterView) -> dict[int, int]:
    held: dict[int, int] = {}
    for g in view.trainer().gpus:
        d = _domain(view, g)
        held[d] = held.get(d, 0) + 1
    return held


def to_trainer_order(view: ClusterView, loads: Sequence[tuple[EngineId, int]]) -> list[EngineId]:
    """Engines ``(id, load)`` in the order they should go to the trainer: least loaded
    first; of equal loads, those in a domain where the trainer already holds the most GPUs
    (its resharding and reduction stay on NVLink), then those whose domain has the most
    candidates of that load (whole domains go together), then the highest id (the order
    without a topology)."""
    if view.gpus_per_node <= 0:
        return [e for e, _ in sorted(loads, key=lambda el: (el[1], -el[0]))]
    held = _trainer_per_domain(view)
    dom = {e: _domain(view, view.engine_gpus(e)[0]) for e, _ in loads}
    same: dict[tuple[int, int], int] = {}
    for e, load in loads:
        same[(dom[e], load)] = same.get((dom[e], load), 0) + 1
    return [e for e, _ in sorted(loads, key=lambda el: (
        el[1], -held.get(dom[el[0]], 0), -same[(dom[el[0]], el[1])], -el[0]))]


def from_trainer_order(view: ClusterView, gpus: Sequence[GpuId], count: int) -> tuple[GpuId, ...]:
    """``count`` of the trainer's ``gpus`` to give back, whole engines where possible: from
    the domains where the trainer holds the fewest GPUs first, so that what stays fills
    whole domains; of equal domains, the highest GPUs. Without a topology: the last
    ``count`` of ``gpus`` (the order a policy took before)."""
    if count <= 0:
        return ()
    if view.gpus_per_node <= 0 or count >= len(gpus):
        return tuple(gpus[len(gpus) - count:]) if count < len(gpus) else tuple(gpus)
    held = _trainer_per_domain(view)
    mine = set(gpus)
    groups: dict[EngineId, list[GpuId]] = {}
    for g in gpus:
        groups.setdefault(view.engine_of(g), []).append(g)
    whole = [gs for e, gs in groups.items() if all(x in mine for x in view.engine_gpus(e))]
    whole.sort(key=lambda gs: (held.get(_domain(view, gs[0]), 0), -max(gs)))
    out: list[GpuId] = []
    for gs in whole:
        if len(out) + len(gs) <= count:
            out.extend(gs)
    if len(out) < count:  # (engines cut by a failure, or a count that is not whole engines)
        chosen = set(out)
        out.extend([g for g in reversed(gpus) if g not in chosen][:count - len(out)])
    return tuple(sorted(out))
