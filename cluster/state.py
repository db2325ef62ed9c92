"""Shared bookkeeping of a run: roles, engines, trainer and trajectory lifecycles.

Both drivers keep their cluster state in a :class:`ClusterState` and hand it to the policy
as its :class:`~rlsched.cluster.view.ClusterView`. Keeping it here, below both drivers,
means the lifecycle is written once and the drivers only add *timing*; the legality rules
are a pure function of the view (:func:`.legality.check`), called by the driver loop.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from .errors import InvariantViolation, PolicyError
from .ids import EngineId, GpuId, Role, TaskId, TrajectoryId, TrajStatus
from .legality import DISPATCHABLE as _DISPATCHABLE
from .legality import NO_ENGINE
from .view import EngineInfo, RolloutTotals, TrainerInfo, TrajectoryInfo

_LOAD = attrgetter("load")


@dataclass(slots=True)
class TrajState:
    """Mutable per-trajectory bookkeeping (drivers only; policies get TrajectoryInfo).

    Who writes what: placement and lifecycle (``status``, ``engine``, ``pinned``, the
    dispatch/finish/training fields) only through :class:`ClusterState`'s driver API
    (``mark_*``, ``enqueue_unbound``/``take_unbound``, ``pin``, ``reset_progress``). The
    per-turn progress (``turns_done``, ``tokens``, ``min_version``, ``max_version``) is
    written in place where a turn ends, by the driver's turn code (the simulator's
    compiled inner loop, :mod:`rlsched.sim.turns`, and the live rollout), as a method call
    there would cost the inner loop a Python call per turn."""

    id: TrajectoryId
    task_id: TaskId
    step: int
    index: int  # row of the driver's own per-trajectory arrays
    status: TrajStatus = TrajStatus.PENDING
    engine: EngineId | None = None
    turns_done: int = 0
    tokens: int = 0
    min_version: int = -1
    max_version: int = -1
    pinned: bool = False  # bound to ``engine`` by Dispatch/Move (else the cluster places it)
    trained_version: int = -1
    in_micro_batch: bool = False
    dispatches: int = 0
    migrations: int = 0
    dispatch_time: float = float("nan")
    finish_time: float = float("nan")
    finish_status: TrajStatus | None = None
    finished_seq: int = 0  # ClusterState.finish_seq when it last finished (0: never)

    def info(self) -> TrajectoryInfo:
        return TrajectoryInfo(
            self.id, self.task_id, self.step, self.status, self.engine,
            self.turns_done, self.tokens, self.min_version, self.pinned,
        )


@dataclass(slots=True)
class RolloutTally:
    """Running sums over the active (not draining) engines of a :class:`ClusterState`:
    what :meth:`ClusterState.rollout_totals` and ``engines()`` answer in O(1). Elastic
    policies read them on every event; summing 256 engines each time was ~10% of a
    seed-scale replay. Kept by :class:`EngineState`'s methods, checked by
    :meth:`ClusterState.check_totals`."""

    engines: int = 0
    live: int = 0  # running + queued
    with_queue: int = 0  # engines whose queue is not empty
    kv: int = 0
    active: list[EngineId] = field(default_factory=list)  # their ids, ascending
    # a driver that sums the KV itself (ClusterState.use_kv_source); then ``kv`` is unused
    kv_source: Callable[[], int] | None = None
    ids: tuple[EngineId, ...] | None = ()  # tuple(active), None once it changes
    # (id, load) of each active engine, beside ``active``: kept by the engines' methods, so
    # that engine_loads() copies a list instead of reading every engine (a seed-scale
    # elastic replay asked ~38,000 times, the first ask after each change)
    pairs: list[tuple[EngineId, int]] = field(default_factory=list)
    # engine_loads()'s answer, None once an active engine's load or the active set changes
    # (elastic asks up to three times a decision, and ~3 in 4 asks at seed scale found the
    # loads as the previous one had)
    loads: tuple[tuple[EngineId, int], ...] | None = None


@dataclass(slots=True)
class EngineState:
    """One rollout engine's bookkeeping. Drivers change ``running``, ``queue``,
    ``kv_used`` and ``draining`` only through the methods below, which keep the cluster's
    :class:`RolloutTally` (once :meth:`ClusterState.add_engine` has added the engine)."""

    id: EngineId
    gpus: tuple[GpuId, ...]
    version: int
    kv_capacity: int
    running: set[TrajectoryId] = field(default_factory=set)
    queue: deque[TrajectoryId] = field(default_factory=deque)
    kv_used: int = 0
    draining: bool = False
    syncing: bool = False
    load: int = 0  # len(running) + len(queue), for least_loaded
    tally: RolloutTally | None = field(default=None, repr=False, compare=False)

    def info(self) -> EngineInfo:
        return EngineInfo(
            self.id, self.gpus, len(self.running), len(self.queue), self.version,
            self.kv_used, self.kv_capacity, self.draining, self.syncing,
        )

    def enqueue(self, tid: TrajectoryId, *, front: bool = False) -> None:
        """``tid`` waits for KV room here (at the head with ``front``)."""
        self.load += 1
        t = self.tally
        if t is not None and not self.draining:
            t.live += 1
            _load_changed(t, self)
            if not self.queue:
                t.with_queue += 1
        if front:
            self.queue.appendleft(tid)
        else:
            self.queue.append(tid)

    def admit(self, tid: TrajectoryId) -> None:
        """``tid`` is admitted straight to ``running`` (from the cluster queue)."""
        self.running.add(tid)
        self.load += 1
        t = self.tally
        if t is not None and not self.draining:
            t.live += 1
            _load_changed(t, self)

    def dequeue(self, *, admit: bool) -> TrajectoryId:
        """The queue's head leaves the queue: to ``running`` (``admit``) or the engine."""
        tid = self.queue.popleft()
        if admit:
            self.running.add(tid)
        else:
            self.load -= 1
        t = self.tally
        if t is not None and not self.draining:
            if not admit:
                t.live -= 1
                _load_changed(t, self)
            if not self.queue:
                t.with_queue -= 1
        return tid

    def discard(self, tid: TrajectoryId) -> None:
        """``tid`` leaves the engine (running or queued), if it is here."""
        t = self.tally
        counted = t is not None and not self.draining
        if tid in self.running:
            self.running.discard(tid)
        elif tid in self.queue:
            self.queue.remove(tid)
            if counted and not self.queue:
                t.with_queue -= 1  # type: ignore[union-attr]
        else:
            return
        self.load -= 1
        if counted:
            t.live -= 1  # type: ignore[union-attr]
            _load_changed(t, self)  # type: ignore[arg-type]

    def set_kv(self, tokens: int) -> None:
        t = self.tally
        if t is not None and not self.draining:
            t.kv += tokens - self.kv_used
        self.kv_used = tokens

    def drain(self) -> None:
        """The engine leaves rollout: it takes no new work and no longer counts."""
        t = self.tally
        if t is not None and not self.draining:
            _count(t, self, -1)
        self.draining = True


def _count(t: RolloutTally, es: EngineState, sign: int) -> None:
    t.engines += sign
    t.live += sign * (len(es.running) + len(es.queue))
    t.with_queue += sign * (len(es.queue) > 0)
    t.kv += sign * es.kv_used
    i = bisect_left(t.active, es.id)
    if sign > 0:
        t.active.insert(i, es.id)
        t.pairs.insert(i, (es.id, es.load))
    else:
        del t.active[i]
        del t.pairs[i]
    t.ids = None
    t.loads = None


def _load_changed(t: RolloutTally, es: EngineState) -> None:
    """An active engine's load changed: its pair, and the kept engine_loads() answer."""
    t.pairs[bisect_left(t.active, es.id)] = (es.id, es.load)
    t.loads = None


class RoleList(list):
    """GPU roles that also keep the GPUs in each role, ascending, so ``gpus_in`` neither
    scans every GPU nor sorts a role's GPUs on every call (drivers change roles through
    ``ClusterState.set_roles``). Kept sorted as GPUs move (a bisection and a list insert
    or delete each): re-sorting the ~1,000 rollout or trainer GPUs after each switch was
    ~4% of a seed-scale elastic replay."""

    __slots__ = ("by_role", "changed")

    def __init__(self, roles: Iterable[Role]) -> None:
        super().__init__(roles)
        self.by_role: dict[Role, list[GpuId]] = {r: [] for r in Role}
        for g, r in enumerate(self):
            self.by_role[r].append(g)  # (ascending: in GPU order)
        self.changed: set[Role] = set(Role)  # roles whose cached tuple is stale

    def assign(self, gpus: Iterable[GpuId], value: Role) -> None:
        """``self[g] = value`` for each of ``gpus`` (one call for a whole role switch)."""
        by_role, changed, get, put = self.by_role, self.changed, list.__getitem__, list.__setitem__
        into = by_role[value]
        for g in gpus:
            old = get(self, g)
            if old is not value:
                put(self, g, value)
                out = by_role[old]
                del out[bisect_left(out, g)]
                insort(into, g)
                changed.add(old)
                changed.add(value)

    def __setitem__(self, index, value) -> None:  # type: ignore[no-untyped-def]
        if not isinstance(index, int):
            raise TypeError("RoleList: assign one GPU at a time (or use assign)")
        self.assign((index,), value)


class ClusterState:
    """Implements :class:`ClusterView` for policies and the lifecycle for drivers."""

    def __init__(
        self,
        num_gpus: int,
        tp: int,
        batches: Sequence[Sequence[tuple[TrajectoryId, TaskId]]],
        max_staleness: int,
    ) -> None:
        if tp < 1 or num_gpus < tp or num_gpus % tp:
            raise ValueError(f"num_gpus={num_gpus} must be a positive multiple of tp={tp}")
        self._now = 0.0
        self._num_gpus = num_gpus
        self._tp = tp
        self.max_staleness = max_staleness
        self.roles: RoleList = RoleList([Role.IDLE] * num_gpus)
        self._by_role: dict[Role, tuple[GpuId, ...]] = {}
        # (add/remove with add_engine/remove_engine; see RolloutTally)
        self.engines_: dict[EngineId, EngineState] = {}
        self._tally = RolloutTally()
        self.trajs: dict[TrajectoryId, TrajState] = {}
        self._batches: list[tuple[TrajectoryId, ...]] = []
        self._unfinished: list[int] = []
        self._finished: dict[TrajectoryId, None] = {}  # insertion-ordered set
        # finishes so far: the driver loop tells a trajectory that finished while a decision's
        # commands were applied from one that had finished before the policy decided
        self.finish_seq = 0
        # per step, the same set; entries found in a micro-batch are dropped when met
        self._finished_by_step: list[dict[TrajectoryId, None]] = []
        # per step, the finished ones that are INTERRUPTED (a subset of the above)
        self._interrupted_by_step: list[dict[TrajectoryId, None]] = []
        for step, batch in enumerate(batches):
            ids = []
            for tid, task in batch:
                if tid in self.trajs:
                    raise ValueError(f"trajectory id {tid!r} appears twice in the run")
                self.trajs[tid] = TrajState(tid, task, step, len(self.trajs))
                ids.append(tid)
            self._batches.append(tuple(ids))
            self._unfinished.append(len(ids))
            self._finished_by_step.append({})
            self._interrupted_by_step.append({})
        self.version = 0
        self.trainer_busy = False
        self.queued_micro_batches = 0
        self.queued_optimizer_steps = 0
        self.accumulated: list[TrajectoryId] = []
        self.switching: set[GpuId] = set()
        self.failed: set[GpuId] = set()  # failed GPUs (role IDLE) until they recover
        # TRAIN GPUs a Reassign asked to leave while a trainer job ran: they keep role TRAIN
        # until the job ends (gpu -> (switch group, target role)); both drivers keep it
        self.leaving_train: dict[GpuId, tuple[int, Role]] = {}
        self.trainer_floor: tuple[int, int] = (1, 1)  # (min_gpus, grow_unit): see set_trainer_floor
        self._floor_why = ""
        self.node_size = 0  # GPUs per NVLink domain (the cost model's topology; 0: flat)
        # the cluster-level queue: unpinned trajectories (QUEUED, engine None) waiting for
        # any engine to admit them, in admission order (see Dispatch); drivers change it
        # through enqueue_unbound/take_unbound
        self.unbound: deque[TrajectoryId] = deque()

    # ------------------------------------------------------------------ view
    @property
    def now(self) -> float:
        return self._now

    @property
    def num_gpus(self) -> int:
        return self._num_gpus

    @property
    def tp(self) -> int:
        return self._tp

    @property
    def gpus_per_node(self) -> int:
        """GPUs per NVLink domain: GPU ``g`` sits in node ``g // gpus_per_node`` (0: one flat
        fabric). Moves within a node are cheaper (sync, resharding) under a topology preset."""
        return self.node_size

    @property
    def num_steps(self) -> int:
        return len(self._batches)

    def role(self, gpu: GpuId) -> Role:
        return self.roles[gpu]

    def gpus_in(self, role: Role) -> tuple[GpuId, ...]:
        roles = self.roles
        if role in roles.changed:
            self._by_role[role] = tuple(roles.by_role[role])
            roles.changed.discard(role)
        return self._by_role[role]

    def engine_of(self, gpu: GpuId) -> EngineId:
        return gpu // self._tp

    def engine_gpus(self, engine: EngineId) -> tuple[GpuId, ...]:
        return tuple(range(engine * self._tp, (engine + 1) * self._tp))

    def engines(self) -> tuple[EngineId, ...]:
        t = self._tally
        if t.ids is None:
            t.ids = tuple(t.active)
        return t.ids

    def engine(self, engine: EngineId) -> EngineInfo:
        try:
            return self.engines_[engine].info()
        except KeyError:
            raise PolicyError(f"engine {engine} is not a rollout engine") from None

    def engine_loads(self) -> tuple[tuple[EngineId, int], ...]:
        """(id, running + queued) of every active engine, ascending id: what routing and
        consolidation choose by, without an :class:`EngineInfo` per engine."""
        t = self._tally
        loads = t.loads
        if loads is None:  # (kept until a load or the active set changes: see RolloutTally)
            loads = t.loads = tuple(t.pairs)
        return loads

    def trainer(self) -> TrainerInfo:
        return TrainerInfo(
            self.gpus_in(Role.TRAIN), self.version, self.trainer_busy,
            self.queued_micro_batches, len(self.accumulated), self.queued_optimizer_steps,
            *self.trainer_floor, self._floor_why,
        )

    def batch(self, step: int) -> tuple[TrajectoryId, ...]:
        return self._batches[step]

    def trajectory(self, trajectory: TrajectoryId) -> TrajectoryInfo:
        try:
            return self.trajs[trajectory].info()
        except KeyError:
            raise PolicyError(f"unknown trajectory {trajectory!r}") from None

    def status(self, trajectory: TrajectoryId) -> TrajStatus:
        try:
            return self.trajs[trajectory].status
        except KeyError:
            raise PolicyError(f"unknown trajectory {trajectory!r}") from None

    def rollout_totals(self) -> RolloutTotals:
        t = self._tally
        return RolloutTotals(t.engines, t.live, t.with_queue,
                             t.kv if t.kv_source is None else t.kv_source(), len(self.unbound))

    def cluster_queue(self) -> tuple[TrajectoryId, ...]:
        """Unpinned trajectories waiting for any engine to admit them, head first."""
        return tuple(self.unbound)

    def use_kv_source(self, total: Callable[[], int]) -> None:
        """The KV in use on the active engines is ``total()``, kept by the driver (which
        still sets each ``EngineState.kv_used``, but not through ``set_kv``)."""
        self._tally.kv_source = total

    def finished(self, step: int | None = None) -> tuple[TrajectoryId, ...]:
        """Finished, not yet trained/dropped, not in a queued micro-batch; finish order."""
        trajs = self.trajs
        if step is None:
            return tuple(t for t in self._finished if not trajs[t].in_micro_batch)
        if not 0 <= step < len(self._finished_by_step):
            return ()
        ready = self._finished_by_step[step]
        batched = [t for t in ready if trajs[t].in_micro_batch]
        for t in batched:  # it leaves the micro-batch only by being trained: drop it now
            del ready[t]
        return tuple(ready)

    def interrupted(self, step: int) -> tuple[TrajectoryId, ...]:
        """The part of ``finished(step)`` whose status is INTERRUPTED, in finish order,
        without scanning the rest (policies that resume them ask on every event)."""
        if not 0 <= step < len(self._interrupted_by_step):
            return ()
        stopped = self._interrupted_by_step[step]
        if not stopped:  # (most asks: a generator costs more than the answer)
            return ()
        trajs = self.trajs
        return tuple(t for t in stopped if not trajs[t].in_micro_batch)

    def unfinished(self, step: int) -> int:
        return self._unfinished[step]

    def leaving_gpus(self) -> tuple[GpuId, ...]:
        """TRAIN GPUs already reassigned away, waiting for the running trainer job."""
        return tuple(sorted(self.leaving_train))

    def failed_gpus(self) -> tuple[GpuId, ...]:
        """GPUs that failed and have not recovered: role IDLE, but no command may use them."""
        return tuple(sorted(self.failed))

    # ------------------------------------------------------------- driver API
    def advance(self, now: float) -> None:
        if now < self._now:
            raise AssertionError(f"time went backwards: {now} < {self._now}")
        self._now = now

    def set_trainer_floor(self, min_gpus: int, grow_unit: int, why: str = "") -> None:
        """The trainer needs ``min_gpus`` GPUs to hold its state and grows by ``grow_unit``
        (the cost model's memory floor; ``why`` names it in refusals)."""
        self.trainer_floor = (min_gpus, grow_unit)
        self._floor_why = why

    # GPU roles, failures and GPUs waiting to leave the trainer: drivers change them only
    # through these (tests/test_ownership.py), so the store is their one writer.
    def set_roles(self, gpus: Iterable[GpuId], role: Role) -> None:
        """``gpus`` take ``role`` now (a switch starts or ends, an engine is lost)."""
        self.roles.assign(gpus, role)

    def mark_failed(self, gpu: GpuId) -> None:
        """``gpu`` failed: role IDLE, and no command may use it until :meth:`mark_recovered`."""
        self.roles.assign((gpu,), Role.IDLE)
        self.failed.add(gpu)

    def mark_recovered(self, gpu: GpuId) -> None:
        """A failed ``gpu`` is back (role IDLE, usable again)."""
        self.failed.discard(gpu)

    def leave_train_later(self, gpu: GpuId, group: int, role: Role) -> None:
        """TRAIN ``gpu`` was asked (switch ``group``) to take ``role`` while a trainer job
        runs: it keeps role TRAIN until the job ends (:meth:`take_leaving`)."""
        self.leaving_train[gpu] = (group, role)

    def take_leaving(self) -> dict[GpuId, tuple[int, Role]]:
        """The trainer's job ended: every GPU waiting to leave (gpu -> (group, role)), and
        none waits any more."""
        leaving = self.leaving_train
        if not leaving:
            return {}
        out = dict(leaving)
        leaving.clear()
        return out

    def cancel_leaving(self, gpu: GpuId) -> tuple[int, Role] | None:
        """``gpu`` will not leave the trainer after all (it failed): its (group, role), if it
        was waiting."""
        return self.leaving_train.pop(gpu, None)

    def add_engine(self, es: EngineState) -> None:
        """``es`` serves rollout from now on (it counts unless it is draining)."""
        if es.id in self.engines_:
            raise ValueError(f"engine {es.id} is already a rollout engine")
        if es.tally is not None:
            raise ValueError(f"engine {es.id} belongs to another cluster state")
        es.tally = self._tally
        if not es.draining:
            _count(self._tally, es, +1)
        self.engines_[es.id] = es

    def remove_engine(self, engine: EngineId) -> EngineState:
        es = self.engines_.pop(engine)
        if not es.draining:
            _count(self._tally, es, -1)
        es.tally = None
        return es

    def check_totals(self) -> None:
        """Raise InvariantViolation if the O(1) tally disagrees with a scan of the engines
        (an engine changed without its methods)."""
        scan = RolloutTally()
        for es in self.engines_.values():
            if es.load != len(es.running) + len(es.queue):
                raise InvariantViolation(f"t={self._now:.3f}: engine {es.id} has load {es.load} but "
                                         f"{len(es.running)} running + {len(es.queue)} queued")
            if not es.draining:
                _count(scan, es, +1)
        t = self._tally
        got = (t.engines, t.live, t.with_queue, t.kv if t.kv_source is None else t.kv_source())
        want = (scan.engines, scan.live, scan.with_queue, scan.kv)
        if got != want:
            raise InvariantViolation(f"t={self._now:.3f}: rollout tally (engines, live, queued, kv) "
                                 f"{got} != scan {want}")
        if t.active != scan.active or t.ids not in (None, tuple(scan.active)):
            raise InvariantViolation(f"t={self._now:.3f}: engine ids {t.active} / {t.ids} != scan {scan.active}")
        fresh = [(e, self.engines_[e].load) for e in scan.active]
        if t.pairs != fresh or t.loads not in (None, tuple(fresh)):
            raise InvariantViolation(f"t={self._now:.3f}: engine loads {t.loads} / {t.pairs} kept "
                                     f"since they changed (a load changed without its methods)")
        for tid in self.unbound:
            ts = self.trajs[tid]
            if ts.status is not TrajStatus.QUEUED or ts.engine is not None or ts.pinned:
                raise InvariantViolation(f"t={self._now:.3f}: {tid!r} waits in the cluster queue but is "
                                         f"{ts.status} on engine {ts.engine} (pinned={ts.pinned})")
        if len(set(self.unbound)) != len(self.unbound):
            raise InvariantViolation(f"t={self._now:.3f}: a trajectory is twice in the cluster queue")

    def least_loaded(self) -> EngineId:
        """The active engine with the least load (running + queued), lowest id first."""
        active = self._tally.active
        if not active:
            raise PolicyError(NO_ENGINE)
        # (min keeps the first of equal loads, and ``active`` is ascending)
        return min(map(self.engines_.__getitem__, active), key=_LOAD).id

    def mark_active(self, tid: TrajectoryId, status: TrajStatus, engine: EngineId) -> None:
        t = self.trajs[tid]
        if t.status in _DISPATCHABLE:
            t.dispatches += 1
            if t.dispatches == 1:
                t.dispatch_time = self._now
        t.status, t.engine = status, engine

    def mark_dispatched(self, tid: TrajectoryId, engine: EngineId | None) -> None:
        """``Dispatch``: QUEUED, pinned to ``engine`` or (None) for the cluster to place;
        an INTERRUPTED trajectory is unfinished again."""
        t = self.trajs[tid]
        if t.status is TrajStatus.INTERRUPTED:
            self.mark_resumable(tid)
        self.mark_active(tid, TrajStatus.QUEUED, engine)  # type: ignore[arg-type]
        t.pinned = engine is not None

    def mark_running(self, tid: TrajectoryId, engine: EngineId) -> None:
        """Admitted on ``engine``: its turn runs there."""
        t = self.trajs[tid]
        t.status, t.engine = TrajStatus.RUNNING, engine

    def mark_queued(self, tid: TrajectoryId, engine: EngineId | None, *, pinned: bool,
                    migrated: bool = False) -> None:
        """Waiting again (preempted, no KV room, moved): QUEUED for ``engine`` (None: the
        cluster queue, see :meth:`enqueue_unbound`), ``pinned`` there or not; ``migrated``
        counts a move of its context between engines."""
        t = self.trajs[tid]
        if migrated:
            t.migrations += 1
        t.status, t.engine, t.pinned = TrajStatus.QUEUED, engine, pinned

    def pin(self, tid: TrajectoryId) -> None:
        """``Move`` to the engine an unpinned trajectory already runs on: it stays, pinned."""
        self.trajs[tid].pinned = True

    def reset_progress(self, tid: TrajectoryId) -> None:
        """Interrupted without keeping progress: it starts over from its first turn."""
        t = self.trajs[tid]
        t.turns_done, t.tokens, t.min_version, t.max_version = 0, 0, -1, -1

    def enqueue_unbound(self, tid: TrajectoryId, *, front: bool = False) -> None:
        """``tid`` (QUEUED) waits in the cluster queue, unpinned, on no engine."""
        t = self.trajs[tid]
        t.engine, t.pinned = None, False
        if front:
            self.unbound.appendleft(tid)
        else:
            self.unbound.append(tid)

    def may_bind(self, tid: TrajectoryId, version: int) -> bool:
        """May the cluster bind unpinned ``tid`` to an engine holding weights ``version``?
        Not when they are older than its step allows (``step - max_staleness``): no legal
        schedule trains a trajectory of step s before version s, so its first token there
        would break the policy's declared bound. (An engine that joined rollout during a
        step's optimizer step, or whose sync failed, holds older weights than the rest: a
        trajectory resumed onto it after a failure was trained two versions on.)"""
        return version >= self.trajs[tid].step - self.max_staleness

    def first_bindable(self, version: int) -> TrajectoryId | None:
        """The first trajectory of the cluster queue an engine holding ``version`` may take
        (:meth:`may_bind`), or None: the queue's order among those it may take."""
        newest = version + self.max_staleness
        trajs = self.trajs
        for tid in self.unbound:
            if trajs[tid].step <= newest:
                return tid
        return None

    def take_unbound(self, tid: TrajectoryId) -> None:
        """``tid`` leaves the cluster queue (admitted, moved, interrupted), if it is in it
        (one moved there during a tool call joins it only when the call returns)."""
        if self.unbound and self.unbound[0] == tid:
            self.unbound.popleft()
        elif tid in self.unbound:
            self.unbound.remove(tid)

    def mark_finished(self, tid: TrajectoryId, status: TrajStatus) -> None:
        t = self.trajs[tid]
        t.status = status
        t.finish_time = self._now
        t.finish_status = status
        self.finish_seq += 1
        t.finished_seq = self.finish_seq
        self._unfinished[t.step] -= 1
        self._finished[tid] = None
        self._finished_by_step[t.step][tid] = None
        if status is TrajStatus.INTERRUPTED:
            self._interrupted_by_step[t.step][tid] = None

    def mark_resumable(self, tid: TrajectoryId) -> None:
        """An INTERRUPTED trajectory was dispatched again: it is unfinished once more."""
        t = self.trajs[tid]
        self._finished.pop(tid, None)
        self._finished_by_step[t.step].pop(tid, None)
        self._interrupted_by_step[t.step].pop(tid, None)
        self._unfinished[t.step] += 1

    def mark_in_micro_batch(self, tids: Iterable[TrajectoryId]) -> None:
        """``TrainMicroBatch``: these are queued for training."""
        trajs = self.trajs
        for tid in tids:
            trajs[tid].in_micro_batch = True

    def mark_trained(self, tids: Iterable[TrajectoryId], version: int) -> None:
        for tid in tids:
            t = self.trajs[tid]
            t.status, t.trained_version, t.in_micro_batch = TrajStatus.TRAINED, version, False
            self._finished.pop(tid, None)
            self._finished_by_step[t.step].pop(tid, None)
            self._interrupted_by_step[t.step].pop(tid, None)

    def mark_dropped(self, tids: Iterable[TrajectoryId]) -> None:
        for tid in tids:
            t = self.trajs[tid]
            t.status = TrajStatus.DROPPED
            self._finished.pop(tid, None)
            self._finished_by_step[t.step].pop(tid, None)
            self._interrupted_by_step[t.step].pop(tid, None)

    # --------------------------------------------------------------- legality
    def in_micro_batch(self, trajectory: TrajectoryId) -> bool:
        t = self.trajs.get(trajectory)
        return t is not None and t.in_micro_batch

    def min_version(self, trajectory: TrajectoryId) -> int:
        try:
            return self.trajs[trajectory].min_version
        except KeyError:
            raise PolicyError(f"unknown trajectory {trajectory!r}") from None
