"""``elastic``: move GPUs between rollout and training as the load shifts.

A reconciliation loop: on every event the policy compares what the cluster does with
what it should do, and issues only the difference. What it should do:

* **Roll out what the weights allow, spread out, longest first.** Batch s may roll out
  once engines hold weights s-k (``staleness`` k). Its trajectories wait in the policy's
  own queue (:class:`~rlsched.policies.placement.LateQueue`) and are placed one by one on
  the least loaded engine with room (``pack``), the longest predicted first
  (:mod:`~rlsched.policies.predict`: the group's finished siblings and the trajectory's
  own progress; nothing about the future). An engine that empties takes queued work.
* **Train what has finished, as it finishes.** The trainer streams micro-batches of the
  step it is on at its current width; the optimizer step follows the step's last one,
  so with k=0 it is the step colocated would take, on the same trajectories.
* **Give the trainer the GPUs rollout no longer needs, and only when it has work.** An
  engine goes to training when the trainer has finished work waiting and the live
  trajectories fit on the other engines without crowding them (``kv_limit``: decode on
  an engine slows with every token of KV it holds, so the tail is never packed).
* **Take GPUs back when a batch needs them.** When a new batch is released the engines
  it needs for its spread come back from the trainer (as soon as its micro-batch ends;
  while they are on their way, the engines up take only their even share of the work in
  flight, :mod:`~rlsched.policies.split`);
  with a backlog to train the trainer keeps enough GPUs to train it within
  ``train_within`` of the last batch's rollout time (measured). With staleness k >= 1 a
  trainer of ``train_share`` of the GPUs starts beside the rollout, as async's split does;
  an empty trainer (``train_share=0``) that no freed engine reaches (a flat tail) gets
  one anyway once as much has finished as still runs (``hedge``). ``train_share=0`` and a
  shorter ``train_within`` (0.4: with staleness k the end of step s releases batch
  s+k+1, so the trainer's backlog is on that chain) were 2-11% faster at five of the
  elastic bench's six k=1 points but up to 23% slower on the regime map's long-sequence,
  training-heavy points, so they are not the defaults.

* **Hold a fixed split when moves cannot pay** (``hold``, staleness k >= 1): moving GPUs to
  the trainer and back costs two role switches and saves at most part of a step's
  training. Once a step's training, measured (its tokens at the measured GPU-seconds per
  token), takes no longer on half the GPUs than those two switches (measured), elastic
  holds a fixed split of half the engines in each role (the flat middle of async's sweep)
  until a heavier step lifts it. Small clusters with few trajectories a step live here:
  it closed the three no-harm counterexamples (2.3 / 1.0 / 2.0% behind the best async, now
  1.0% behind / 2.8% / 0.2% ahead); it engaged at no point of the elastic bench (64 and 256
  GPUs) nor the regime map.
* **A micro-batch waits for GPUs on their way** (``join``): a micro-batch runs on the GPUs
  the trainer has when it starts, so when a trajectory (typically the step's last, the
  longest) would finish sooner on the trainer after the engines switching to it arrive,
  at the measured rate and switch time, by more than half a switch, it waits for them.

* **Spread the tail that is left** (``steal``): an engine kept in rollout with nothing to
  do takes (``Move``) the trajectory predicted longest off an engine crowded with three
  or more, instead of idling beside it; the driver charges the KV transfer.
* **Isolate the tail** (``isolate``, on by default): once a step is down to its tail (at
  most two unfinished trajectories per rollout engine), its live trajectories, predicted
  longest first, each move once to the engine with the fewest live trajectories when
  they would share it with fewer than their own: decode on an engine slows with every
  sequence and KV token it holds, and with staleness a step's longest trajectory shares
  its engine with two batches' bulk. Measured against ``isolate=false`` (simulated, the
  elastic bench's six points and the regime map's twelve): at k=1 faster at five bench
  points (by up to 11% on the growing preset), slower by 0.3% at the sixth and by at most
  0.01% on the map; at k=0 faster at all six bench points (0.03-1.2%). It costs 0.7 points
  on one small no-harm case (4 engines, 8 trajectories a step: 2.3% behind the best async
  instead of 1.6%); ``isolate=false`` gives the earlier schedule.
* **Cut the tail, if asked** (``cut``, staleness k >= 1 only): the step's optimizer step
  need not wait for its last few trajectories; they are trained with the next step (and
  batches are released one version later, so that stays within k).

With k=0 this is colocated's schedule plus training that starts in the tail; with k >= 1
batch s+1 is released the moment weights s+1-k exist and its rollout overlaps the
training of batch s.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlsched.cluster.commands import (
    Command,
    Interrupt,
    Move,
    OptimizerStep,
    Reassign,
    SyncWeights,
    TrainMicroBatch,
)
from rlsched.cluster.errors import PolicyError
from rlsched.cluster.events import (
    Event,
    MicroBatchFinished,
    RolesChanged,
    TrainStepFinished,
    TrajectoryFinished,
    WeightsSynced,
    WorkerRecovered,
)
from rlsched.cluster.ids import Drain, Role, TrajStatus
from rlsched.cluster.legality import check as legality_check
from rlsched.cluster.policy import Configured, param
from rlsched.cluster.view import ClusterView, TrainerInfo

from .common import back_to_rollout, idle_engines, usable
from .meter import Meter
from .placement import LateQueue, per_engine_cap
from .predict import LengthPredictor
from .registry import register
from .split import share_while_coming

# An engine is crowded, for stealing, from this many live trajectories on. Moving one of
# two measured worse than leaving them (the transfer, and an engine busy that the trainer
# could have had, on small long-tailed traces: the no-harm counterexample went from 1.7% to
# 2.6% behind the best async with 2, 1.6% with 3; the bench's figures were the same).
_CROWDED = 3
# A rolling step is in its tail, for ``isolate``, once it has no more than this many
# unfinished trajectories per rollout engine. Measured against no isolation (elastic bench,
# six k=1 points; regime map, twelve): 1: bench -3.1..+0.8%, map up to +0.6%; 2: bench
# -11.0..+0.3% (swe-seed 256), map -5.5..+0.01%; 3: bench -9.9..-0.6% but map +11.6% (qwen
# 256 GPUs, tail 0.05). No trigger won everywhere; 2 loses least, and is the default.
_TAIL_PER_ENGINE = 2
# ``join`` waits for GPUs on their way only when that saves more than this share of a
# (measured) switch: the rate is a mean per token (long sequences cost more per token) and
# the switch the last one measured, so smaller predicted savings are within what the
# estimates miss. Measured on the elastic bench at k=1 (six points): with no margin, 2.7%
# and 1.2% faster at shipped / swe-seed 64 but 0.8% slower at shipped 256 (each from
# marginal waits whose effect cascades); with 0.5 (1 and 2 gave the same), 0-0.25% faster
# at all six.
_JOIN_MARGIN = 0.5
_OPEN = (TrajStatus.PENDING, TrajStatus.QUEUED, TrajStatus.RUNNING, TrajStatus.INTERRUPTED)


def _legal(view: ClusterView, cmd: Command) -> bool:
    """Would the driver accept ``cmd`` now (the contract's own check, read-only)?"""
    try:
        legality_check(view, cmd)
    except PolicyError:
        return False
    return True


@dataclass(frozen=True)
class ElasticConfig:
    tail: float = param("float", 1.0, "hand engines to training only once fewer than this share "
                        "of the oldest rolling step's trajectories are live (1: whenever an engine is not "
                        "needed; 0: only once none is)", low=0.0, high=1.0)
    pack: float = param("float", 1.0, "an engine holds at most this multiple of an even spread, "
                        "over all engines, of the batches the staleness lets roll out at once (k+1; while "
                        "engines are on their way to rollout, of the work in flight over the engines up and "
                        "coming)", low=0.1, high=64.0)
    kv_limit: float = param("float", 0.05, "keep enough engines that each holds at most this share "
                            "of its KV capacity (decode slows as KV grows: small keeps the tail fast)", low=0.01, high=1.0)
    min_engines: int = param("int", 1, "never shrink rollout below this many engines while a "
                             "step rolls out (once none does: none with staleness 0, one otherwise)", low=1, high=4096)
    drain: str = param("choice", "migrate", "what in-flight trajectories on a released engine do", choices=tuple(d.value for d in Drain))
    staleness: int = param("int", 0, "k: batch s may be generated by weights s-k (0: on-policy)", low=0, high=8, tunable=False)
    train_share: float = param("float", 0.25, "with staleness >= 1: the share of GPUs the trainer "
                               "starts with, and keeps when a new batch takes engines back while it has finished "
                               "work to train, until its speed and a batch's rollout time were measured (0: it "
                               "starts empty and forms from engines rollout frees)", low=0.0, high=0.95)
    train_within: float = param("float", 1.0, "with staleness >= 1: once measured, the trainer keeps "
                                "enough GPUs to train the finished work it holds within this share of the last "
                                "batch's rollout time when a new batch takes engines back (its step's end "
                                "releases the batch after next: small keeps that chain short)", low=0.01, high=4.0)
    micro: int = param("int", 1, "trajectories per trainer GPU in one micro-batch (a "
                       "micro-batch runs on the GPUs the trainer has when it starts)", low=1, high=4096)
    order: str = param("choice", "longest", "which queued trajectory is placed first: the "
                       "longest predicted (from finished siblings and own progress) or trace order", choices=("longest", "fifo"))
    cut: float = param("float", 0.0, "with staleness k >= 1: once the trainer has trained every "
                       "finished trajectory of its step and no more than this share of the step's "
                       "trajectories are still live, the step goes ahead without them: they are cut from "
                       "it (keeping every token; they go on generating) and trained with the next step, "
                       "never cut twice. Batches are then released one version later (k-1 ahead), so a "
                       "cut trajectory's oldest token stays within k of the version that trains it "
                       "(0: never cut; ignored at staleness 0)", low=0.0, high=1.0)
    cut_stop: bool = param("bool", False, "a cut trajectory is interrupted keeping its finished "
                           "turns (the turn in progress is lost) and resumed, prefilled again, with the next "
                           "step's batch once its weights exist, instead of running on")
    hedge: bool = param("bool", True, "with staleness >= 1 and no GPU training: once the finished "
                        "work waiting is as much as what still rolls out, an engine goes to the trainer even if "
                        "the tail must be packed (past kv_limit) for it; without this, a flat tail frees no "
                        "engine until the batch is nearly over and the finished work waits for it")
    steal: bool = param("bool", True, "an idle rollout engine takes (Move) the live trajectory "
                        "predicted longest from the most crowded engine holding three or more (its KV moves "
                        "with it, charged by the driver), instead of idling while the tail shares an engine")
    isolate: bool = param("bool", True, "once a rolling step has no more than two unfinished "
                          "trajectories per rollout engine (its tail), each of its live ones, predicted longest "
                          "first, moves (Move, once) to the engine with the fewest live trajectories if it "
                          "would share that one with fewer than its own (decode slows with every sequence and "
                          "KV token an engine holds); false: the tail stays where it runs")
    hold: bool = param("bool", True, "with staleness >= 1: once a step's training, measured, "
                       "takes no longer on half the GPUs than a role switch there and back (no move "
                       "between the roles can repay its switches), hold a fixed split of half the engines "
                       "in each role, as async does, until a later step measures otherwise or the run's "
                       "last rollout is over; false: GPUs move whatever the measured cost")
    join: bool = param("bool", True, "a micro-batch ready to train waits for GPUs on their way to "
                       "the trainer when, at the measured training rate and switch time, it would finish "
                       "sooner, by more than half a switch, on the larger trainer after they arrive (a "
                       "micro-batch runs on the GPUs the trainer has when it starts); false: it starts at once")


@register
class Elastic(Configured):
    name: ClassVar[str] = "elastic"
    Config = ElasticConfig
    config: ElasticConfig

    @property
    def max_staleness(self) -> int:
        return self.config.staleness

    @property
    def _cutting(self) -> bool:
        return self.config.cut > 0.0 and self.config.staleness >= 1

    @property
    def defers(self) -> bool:
        """A cut trajectory of step s is trained with step s+1 (the bound is then weaker)."""
        return self._cutting

    @property
    def _ahead(self) -> int:
        """How many versions ahead of the trainer a batch is released: the staleness, less
        the one version a cut trajectory may take to be trained."""
        return self.config.staleness - 1 if self._cutting else self.config.staleness

    def _lengths(self) -> LengthPredictor:
        """The length predictor (the oracle reference overrides this)."""
        return LengthPredictor()

    def reset(self, view: ClusterView, rng: random.Random) -> None:
        self._released = 0  # batches released to the queue
        self._train_step = 0  # batch the trainer is working on (= version it will produce - 1)
        self._in_micro = 0  # trajectories of _train_step sent to micro-batches
        self._opt_sent = False
        self._switching = 0  # Reassign commands not yet reported by RolesChanged
        self._to_rollout: set[int] = set()  # GPUs sent to rollout, not yet there
        self._moving: set[int] = set()  # GPUs of Reassigns not yet reported by RolesChanged
        self._sent_now: set[int] = set()  # GPUs of Reassigns sent in the decision under way
        self._to_train: dict[tuple[int, ...], float] = {}  # GPUs switching to train: issued at
        self._arrived = -1.0  # when the newest group that joined the trainer was sent
        self._queue = LateQueue()
        self._predictor = self._lengths()
        self._cap = 1
        self._even = 1  # the cap of an even spread (pack=1): how many engines a batch needs
        self._meter = Meter()
        self._stolen: set[str] = set()  # trajectories an idle engine took (moved once only)
        self._stolen_to: dict[int, str] = {}  # engine -> the trajectory it took last
        self._cut_from: dict[int, frozenset[str]] = {}  # step -> its trajectories trained with step+1
        self._hold = 0  # GPUs of the trainer's side of a held fixed split (0: none held)

    # ------------------------------------------------------------------ events
    def on_event(self, event: Event, view: ClusterView) -> Sequence[Command]:
        cmds: list[Command] = []
        self._sent_now.clear()
        match event:
            case RolesChanged(gpus=gpus, role=Role.ROLLOUT):
                self._switching -= 1
                self._arrive(gpus, Role.ROLLOUT, view)
                cmds += self._refresh(view, gpus)
            case RolesChanged(gpus=gpus, role=role):
                self._switching -= 1
                self._arrive(gpus, role, view)
            case MicroBatchFinished():
                self._meter.micro_batch_done(view.now)
            case TrajectoryFinished(trajectory=t, status=st) if st in (TrajStatus.DONE, TrajStatus.TIMED_OUT):
                info = view.trajectory(t)
                self._predictor.observe(info.task_id, info.turns_done)
                if view.unfinished(info.step) == 0 and not self._queue.pending(info.step):
                    self._meter.batch_done(info.step, view.now)
            case TrainStepFinished(version=v):
                self._train_step, self._in_micro, self._opt_sent = v, 0, False
                self._meter.step_trained()
                self._hold = self._hold_gpus(view)
                if v >= view.num_steps:
                    return []
                if view.engines():
                    cmds.append(SyncWeights())
            case WeightsSynced():
                pass
        if isinstance(event, WorkerRecovered | RolesChanged) and view.gpus_in(Role.IDLE):
            back = idle_engines(view)  # failures left whole engines idle: roll out again
            if back and view.gpus_in(Role.ROLLOUT) + view.gpus_in(Role.TRAIN):
                cmds += self._send(view, back, Role.ROLLOUT)
        if self._switching == 0 and not view.gpus_in(Role.ROLLOUT) and not view.gpus_in(Role.TRAIN):
            gpus = usable(view, Role.ROLLOUT)  # (every GPU, unless some failed)
            if gpus:  # start of the run: every GPU rolls out (with staleness, but a trainer)
                return cmds + self._start(view, gpus)
        tr = view.trainer()  # (the view does not change while the policy decides)
        self._release_batches(view)
        self._requeue_interrupted(view)
        grow = self._grow_to_hold(view, tr)
        cmds += grow
        coming = self._coming(view)
        cap = self._cap
        if coming:  # (engines on their way to rollout: those up take only their share)
            totals = view.rollout_totals()
            cap = share_while_coming(cap, totals.live + totals.unbound + len(self._queue),
                                     len(view.engines()), coming // view.tp, self.config.pack)
        placed = self._queue.place(view, cap,
                                   self._min_version,
                                   self._predictor.remaining if self.config.order == "longest" else None,
                                   hold=coming // view.tp,
                                   skip=frozenset(view.engine_of(g) for c in grow for g in c.gpus))
        cmds += placed
        cmds += self._reclaim(view, tr)
        cmds += self._cut_tail(view, tr)
        leaving = {g for c in cmds if isinstance(c, Reassign) and c.role is not Role.TRAIN for g in c.gpus}
        trained: list[Command] = []
        if not leaving or leaving.isdisjoint(tr.gpus):
            # (a micro-batch queued while the trainer's GPUs are being handed back would
            # start on whatever GPUs it gets later: wait until it has them)
            trained = self._train(view, tr)
        if not placed and not self._queue:  # let new work settle before releasing engines
            released = self._consolidate(view, tr)
            trained = self._withhold(view, tr, trained, released)
            cmds += trained + (released or self._steal_tail(view))
        else:
            cmds += trained
        if self.config.isolate and isinstance(event, TrajectoryFinished | RolesChanged):
            cmds += self._isolate_tail(view, cmds)
        return cmds

    def _arrive(self, gpus: tuple[int, ...], role: Role, view: ClusterView) -> None:
        """GPUs of a Reassign finished their switch to ``role``. A driver may report it
        after the policy sent the same GPUs on to another role (a new engine's EngineIdle
        comes before its RolesChanged, and an idle engine may go to the trainer at once):
        that second switch is still under way, so only what was sent to ``role`` ends."""
        arrived = set(gpus)
        on_way = set()  # (GPUs sent on to another role meanwhile: switching still)
        if role is not Role.ROLLOUT:
            on_way.update(g for g in self._to_rollout if view.role(g) is Role.SWITCHING)
        for key in [k for k in self._to_train if arrived.intersection(k)]:
            if role is not Role.TRAIN and self._switching_to_train(view, key):
                on_way.update(key)
                continue
            # (a failure may have taken some of a group's GPUs: match by overlap)
            self._arrived = max(self._arrived, self._to_train.pop(key))
        self._moving.difference_update(g for g in gpus if g not in on_way)
        if role is Role.ROLLOUT:
            self._to_rollout.difference_update(gpus)
        self._meter.switch_done(gpus, view.now, role)

    @staticmethod
    def _switching_to_train(view: ClusterView, key: tuple[int, ...]) -> bool:
        """Is a group sent to the trainer still on its way (a GPU of it switching, not
        failed)? A group a failure took out of its switch never reports its arrival."""
        failed = set(view.failed_gpus())
        return any(view.role(g) is Role.SWITCHING and g not in failed for g in key)

    def _refresh(self, view: ClusterView, gpus: tuple[int, ...]) -> list[Command]:
        """New engines with weights older than the trainer's (a driver may load the weights
        when the switch starts, and an optimizer step can end meanwhile) get a sync."""
        version = view.trainer().version
        engines = view.engines()
        stale = tuple(sorted({e for e in (view.engine_of(g) for g in gpus)
                              if e in engines and view.engine(e).version < version}))
        return [SyncWeights(stale)] if stale else []

    def _send(self, view: ClusterView, gpus: tuple[int, ...], role: Role,
              drain: Drain = Drain.MIGRATE) -> list[Command]:
        self._switching += 1
        self._moving.update(gpus)
        self._sent_now.update(gpus)
        if role is Role.ROLLOUT:
            self._to_rollout.update(gpus)
        elif role is Role.TRAIN:
            self._to_train[gpus] = view.now
        self._meter.switch_sent(gpus, view.now, role)
        return [Reassign(gpus, role, drain)]

    def _start(self, view: ClusterView, gpus: tuple[int, ...]) -> list[Command]:
        """Every GPU rolls out; with staleness k >= 1 and ``train_share`` > 0 a trainer of
        that share of the GPUs (whole engines) starts at once too, as the asynchronous
        split does (GPUs that start in the trainer never pay a switch to get there later,
        but idle until something has finished)."""
        if not self._ahead or view.num_steps < 2:
            return self._send(view, gpus, Role.ROLLOUT)
        train = min(self._reserve(view), len(gpus) - view.tp)
        if train <= 0:
            return self._send(view, gpus, Role.ROLLOUT)
        return self._send(view, gpus[:len(gpus) - train], Role.ROLLOUT) + \
            self._send(view, gpus[len(gpus) - train:], Role.TRAIN)

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
        floor = view.trainer().min_gpus  # (a trainer below its memory floor runs nothing)
        if gpus < floor:
            gpus = math.ceil(floor / view.tp) * view.tp
            if gpus > view.num_gpus - view.tp:
                return 0  # no room for both: the trainer forms when the rollout frees it
        return gpus

    def _hold_gpus(self, view: ClusterView) -> int:
        """``hold``: GPUs of the trainer's side of a fixed split to hold, or 0 to go on moving
        GPUs. Moving GPUs to the trainer and back costs two role switches, and the most it
        can save is part of a step's training; so once a step's training (its tokens at the
        measured GPU-seconds per token) takes, on half the GPUs, no longer than those two
        switches (measured), no move can repay itself. Elastic is then a fixed split, and of
        the fixed splits it holds the middle one, half the engines (at least the trainer's
        memory floor): async's makespan over its ``rollout_fraction`` is flat in the middle
        and steep at the ends (a small long-tailed case, seed 1: 348.9 s at 0.25, 353.7 s at
        0.5, 397.1 s at 0.75; seed 16: 410.2 / 405.1 / 435.7 s), and this regime is the one
        whose rollout is the tail's latency rather than its GPUs. Measured after each
        optimizer step from this run's events only (the workload drifts: a heavier step lifts
        the hold)."""
        if not self.config.hold or not self._ahead or view.num_steps < 2:
            return 0
        m = self._meter
        work = m.step_train_gpu_s()
        engines = view.num_gpus // view.tp
        if work is None or m.switch_s is None or engines < 2:
            return 0
        half = engines // 2 * view.tp
        floor = view.trainer().min_gpus
        if half < floor:
            half = math.ceil(floor / view.tp) * view.tp
            if half > view.num_gpus - view.tp:
                return 0  # no room for both sides: nothing to hold
        return half if work / half <= 2.0 * m.switch_s else 0

    def _grow_to_hold(self, view: ClusterView, tr: TrainerInfo) -> list[Command]:
        """A held split whose trainer is short of its side by whole engines takes them from
        rollout, the least loaded first (their live trajectories migrate with ``drain``),
        keeping at least ``min_engines`` rolling out. An empty trainer grows too: a batch
        released while no engine rolled out takes every GPU back (``_reclaim``), and a held
        split, whose consolidation waits for this growth, would otherwise never train again
        (a stall, found on a 2-engine trace with no length spread)."""
        if not self._hold:
            return []
        have = sum(1 for g in tr.gpus if g not in self._to_rollout) + sum(len(k) for k in self._to_train)
        ids = view.engines()
        n = min((self._hold - have) // view.tp, len(ids) - self.config.min_engines)
        if n <= 0:
            return []
        victims = sorted(view.engine_loads(), key=lambda el: (el[1], -el[0]))[:n]
        gpus = tuple(g for e in sorted(e for e, _ in victims) for g in view.engine_gpus(e))
        return self._send(view, gpus, Role.TRAIN, Drain(self.config.drain))

    def _coming(self, view: ClusterView) -> int:
        """GPUs on their way to rollout (switching, or in the trainer until its micro-batch
        ends). One a failure took out of its switch never reports: it is forgotten here. One
        sent in this decision is still in its old role in the view and stays moving (else
        consolidation, later in the same decision, could send it to the trainer again)."""
        on_way = (Role.SWITCHING, Role.TRAIN)
        failed = set(view.failed_gpus())
        fresh = self._sent_now
        self._to_rollout = {g for g in self._to_rollout if view.role(g) in on_way and g not in failed}
        self._moving = {g for g in self._moving
                        if (g in fresh or view.role(g) in on_way) and g not in failed}
        return len(self._to_rollout)

    def _min_version(self, step: int) -> int:
        return step - self._ahead

    # ----------------------------------------------------------------- rollout
    def _release_batches(self, view: ClusterView) -> None:
        """Queue every batch the trainer's weights allow (s - k <= version)."""
        last = min(view.trainer().version + self._ahead, view.num_steps - 1)
        while self._released <= last:
            batch = view.batch(self._released)
            self._queue.add(self._released, batch)
            self._meter.batch_released(self._released, view.now)
            in_flight = min(self._ahead + 1, view.num_steps)
            engines = view.num_gpus // view.tp - (self._hold or self._reserve(view)) // view.tp
            self._cap = per_engine_cap(len(batch) * in_flight, engines, self.config.pack)
            self._even = per_engine_cap(len(batch) * in_flight, engines, 1.0)
            self._released += 1

    def _requeue_interrupted(self, view: ClusterView) -> None:
        """Trajectories a drain or a failure stopped go back to the queue's front; they
        resume from their last finished turn (this policy trains no partial trajectory)."""
        for s in range(max(0, self._train_step - 1), self._released):
            stopped = view.interrupted(s)
            if stopped:
                cut = self._cut_from.get(s, ())
                self._queue.add(s, tuple(t for t in stopped if t not in cut), front=True)
                # (a cut one resumes with the step that trains it, on its weights)
                self._queue.add(s + 1, tuple(t for t in stopped if t in cut), front=True)

    def _reclaim(self, view: ClusterView, tr: TrainerInfo) -> list[Command]:
        """Bring trainer GPUs back to rollout while queued work has no engine to go to."""
        if not self._queue or not tr.gpus:
            return []
        tp = view.tp
        queued = len(self._queue)  # what the engines up now could not take
        if queued <= 0:
            return []
        stranded = not view.engines() and not self._coming(view)
        if not stranded and self._meter.rollout_s is not None and not self._pays(self._meter.rollout_s):
            # a batch's rollout is over before an engine taken back would have paid for
            # its switch: the queue goes to the engines already rolling out
            self._cap = 1 << 30
            return []
        coming = self._coming(view) // tp
        want = math.ceil(queued / min(self._cap, self._even)) - coming  # engines it still needs
        if want <= 0:
            return []
        keep = self._trainer_keep(view) if self.config.staleness else 0
        if self._hold:
            keep = self._hold  # a held split: the trainer keeps its side
        if not view.engines() and not coming:
            keep = 0  # no engine rolls out: the queue would wait forever
        # (GPUs already sent away stay in TRAIN until their micro-batch ends: not twice)
        free = tuple(g for g in tr.gpus if g not in self._moving)
        spare = (len(free) - keep) // tp
        if spare <= 0:
            return []
        n = spare if self._hold else min(spare, want)  # (a held split: back to its sides)
        left = len(free) - n * tp
        take = free[len(free) - n * tp:]
        if 0 < left < tr.min_gpus:  # never shrink the trainer below its floor (refused)
            if keep:
                n = (len(free) - tr.min_gpus) // tp
                if n <= 0:
                    return []
                take = free[len(free) - n * tp:]
            else:  # empty it (GPUs short of a whole engine go IDLE: back_to_rollout)
                take = free
        rollout, idle = back_to_rollout(view, take)
        out: list[Command] = []
        if rollout and idle:
            # Each Reassign must leave the trainer at its floor or empty (the contract's check:
            # a GPU left behind that could have gone along counts). Emptying it takes two
            # (whole engines to rollout, the rest idle); when the first would be refused, the
            # other order, and if that is refused too every trainer GPU goes idle at once
            # and whole engines roll out from there (after failures the trainer sat at its
            # floor with GPUs whose engines were not whole; found under the fingerprint's
            # fault schedule, where rollout first was refused).
            if _legal(view, Reassign(rollout, Role.ROLLOUT)):
                return self._send(view, rollout, Role.ROLLOUT) + self._send(view, idle, Role.IDLE)
            if _legal(view, Reassign(idle, Role.IDLE)):
                return self._send(view, idle, Role.IDLE) + self._send(view, rollout, Role.ROLLOUT)
            mine = set(tr.gpus)
            return self._send(view, tuple(sorted(g for g in rollout + idle if g in mine)), Role.IDLE)
        if rollout:
            out += self._send(view, rollout, Role.ROLLOUT)
        if idle:
            out += self._send(view, idle, Role.IDLE)
        return out

    def _pays(self, seconds: float) -> bool:
        """Is moving GPUs for work of ``seconds`` worth a switch there and back (as far as
        measured: before the first switch was timed, it is)?"""
        sw = self._meter.switch_s
        return sw is None or seconds > 2.0 * sw

    def _gains(self, view: ClusterView, have: int, add: int) -> bool:
        """Does the trainer (``have`` GPUs) finish what is ready sooner by more than a
        switch if ``add`` GPUs join it after their switch (measured times; before the
        first micro-batch was timed, no: its own GPUs go first)?"""
        sw = self._meter.switch_s
        alone = self._ready_seconds(view, have)
        if sw is None:
            return alone > 0
        if alone <= sw:
            return False
        joined = sw + (alone - sw) * have / (have + add)
        return alone - joined > sw

    def _ready_seconds(self, view: ClusterView, gpus: int) -> float:
        """Seconds the trainer needs, on ``gpus`` GPUs, for the finished work it has not
        been sent (measured rate; before the first micro-batch was timed, none: the
        trainer's own GPUs go first, and the next event knows the rate)."""
        rate = self._meter.train_gpu_s_per_token
        if rate is None:
            return 0.0
        ready = [t for s in range(max(0, self._train_step - 1), self._released) for t in view.finished(s)]
        return sum(view.trajectory(t).tokens for t in ready) * rate / max(1, gpus)

    def _trainer_keep(self, view: ClusterView) -> int:
        """GPUs the trainer keeps when a new batch takes engines back: enough to train its
        backlog within ``train_within`` of the time the last batch's rollout took,
        measured; ``train_share`` of the GPUs until both were measured. (1.0, the default,
        sizes the trainer so that neither side waits for the other on average; with
        staleness the trainer's step end releases a later batch, so its backlog is on the
        critical chain, and 0.4 measured 2-8% faster at 5 of the elastic bench's 6 k=1
        points -- but slower on the regime map's training-heavy points.)"""
        ready = [t for s in range(max(0, self._train_step - 1), self._released) for t in view.finished(s)]
        if not ready:
            return 0
        m = self._meter
        if m.train_gpu_s_per_token is None or not m.rollout_s:
            keep = round(self.config.train_share * view.num_gpus)
        else:
            tokens = sum(view.trajectory(t).tokens for t in ready)
            within = self.config.train_within * m.rollout_s
            keep = min(math.ceil(tokens * m.train_gpu_s_per_token / within), view.num_gpus - view.tp)
        # a trainer kept at all is kept at its memory floor (below it, it runs nothing)
        return max(keep, view.trainer().min_gpus) if keep > 0 else 0

    # ---------------------------------------------------------------- training
    def _backlog(self, view: ClusterView) -> int:
        """Finished trajectories the trainer has not been sent yet (its step and later)."""
        return sum(len(view.finished(s)) for s in range(max(0, self._train_step - 1), self._released))

    def _train(self, view: ClusterView, tr: TrainerInfo) -> list[Command]:
        s = self._train_step
        if s >= view.num_steps or s >= self._released or self._opt_sent:
            return []
        if not tr.gpus or tr.queued_micro_batches or tr.busy:
            return []  # (sent to an idle trainer: its duration is measured)
        if any(t <= self._arrived for t in self._to_train.values()):
            return []  # GPUs sent with those that just joined end their switch now too: wait
        ready = self._ready(view, s)
        if ready:
            # A micro-batch runs on the GPUs the trainer has when it starts; GPUs that join
            # later wait for the next one, so micro-batches are small (one trajectory per
            # GPU by default): every GPU that arrives starts within one of them.
            # While more GPUs are on their way to the trainer, one trajectory at a time, so
            # they join within a fraction of one trajectory's training.
            ready = ready[:1] if self._to_train else ready[:self.config.micro * len(tr.gpus)]
            tokens = sum(view.trajectory(t).tokens for t in ready)
            if self._to_train and self._sooner_joined(view, len(tr.gpus), tokens):
                return []  # (the GPUs' RolesChanged starts it on the larger trainer)
            self._in_micro += len(ready)
            self._meter.micro_batch_sent(len(tr.gpus), tokens, view.now)
            return [TrainMicroBatch(ready)]
        if self._open(view, s) == 0 and self._in_micro == self._size(view, s):
            self._opt_sent = True
            return [OptimizerStep()]
        return []

    def _withhold(self, view: ClusterView, tr: TrainerInfo, trained: list[Command],
                  released: list[Command]) -> list[Command]:
        """``join`` for engines released to the trainer in the same decision as a micro-batch
        (the step's last trajectory finishing empties an engine): the micro-batch is taken
        back, to start when they arrive, if it would finish sooner on them."""
        if not any(isinstance(c, Reassign) and c.role is Role.TRAIN for c in released):
            return trained
        mbs = [c for c in trained if isinstance(c, TrainMicroBatch)]
        if len(mbs) != 1:
            return trained
        tokens = sum(view.trajectory(t).tokens for t in mbs[0].trajectories)
        fresh = frozenset(c.gpus for c in released if isinstance(c, Reassign) and c.role is Role.TRAIN)
        if not self._sooner_joined(view, len(tr.gpus), tokens, fresh):
            return trained
        self._in_micro -= len(mbs[0].trajectories)
        self._meter.micro_batch_withdrawn()
        return [c for c in trained if c is not mbs[0]]

    def _sooner_joined(self, view: ClusterView, gpus: int, tokens: int,
                       fresh: frozenset[tuple[int, ...]] = frozenset()) -> bool:
        """``join``: would a micro-batch of ``tokens`` finish sooner if it waited for the GPUs on
        their way to the trainer (each group due a measured switch after it was sent) than
        started now on the trainer's ``gpus``, by more than ``_JOIN_MARGIN`` of a switch?
        Only groups still switching count (their arrival is reported: the wait ends), and
        ``fresh`` ones, sent in this decision. (Unmeasured rate or switch: no.)"""
        m = self._meter
        rate, sw = m.train_gpu_s_per_token, m.switch_s
        if not self.config.join or rate is None or sw is None or gpus <= 0:
            return False
        work = tokens * rate
        now_end = view.now + work / gpus
        joined = gpus
        for sent, n in sorted((t, len(k)) for k, t in self._to_train.items()
                              if k in fresh or self._switching_to_train(view, k)):
            joined += n  # (a group still switching reports its arrival: the wait ends)
            if max(view.now, sent + sw) + work / joined + _JOIN_MARGIN * sw < now_end:
                return True
        return False

    def _ready(self, view: ClusterView, s: int) -> tuple[str, ...]:
        """Finished trajectories the trainer's step ``s`` trains and has not been sent: the
        step's own, less those cut from it, and those cut from step s-1."""
        cut, carried = self._cut_from.get(s, ()), self._cut_from.get(s - 1, ())
        stopped = set(view.interrupted(s))
        ready = tuple(t for t in view.finished(s) if t not in stopped and t not in cut)
        if carried:
            stopped = set(view.interrupted(s - 1))
            ready += tuple(t for t in view.finished(s - 1) if t in carried and t not in stopped)
        return ready

    def _size(self, view: ClusterView, s: int) -> int:
        """How many trajectories step ``s`` trains (its batch, less and plus the cut)."""
        return len(view.batch(s)) - len(self._cut_from.get(s, ())) + len(self._cut_from.get(s - 1, ()))

    def _open(self, view: ClusterView, s: int) -> int:
        """Trajectories step ``s`` trains that have not finished (or wait to be placed)."""
        n = view.unfinished(s) + self._queue.pending(s)
        if self._cut_from.get(s) or self._cut_from.get(s - 1):
            live = (TrajStatus.PENDING, TrajStatus.QUEUED, TrajStatus.RUNNING)
            n -= sum(1 for t in self._cut_from.get(s, ()) if view.status(t) in live)
            n += sum(1 for t in self._cut_from.get(s - 1, ()) if view.status(t) in live)
        return n

    # ----------------------------------------------------------------- cutting
    def _cut_tail(self, view: ClusterView, tr: TrainerInfo) -> list[Command]:
        """Cut the tail of the trainer's step (``cut``): when the trainer has trained all
        of the step it can and only a few of its trajectories are still live, those few
        are trained with the next step instead, so the optimizer step, the new weights and
        the next batch's release do not wait for them. They are not stopped: they keep
        their engine, KV and tokens and take the new weights with their engine (the
        driver charges the sync as for every engine); with ``cut_stop`` they are
        interrupted keeping their finished turns and resumed with the next step's batch
        (APRIL / Kimi k1.5's partial rollout). Legal only if the version that
        trains them (step+1) is within the staleness of their oldest token; one cut from
        the previous step is never cut again (it is trained now)."""
        s = self._train_step
        if (not self._cutting or s in self._cut_from or s + 1 >= view.num_steps
                or s >= self._released or self._opt_sent):
            return []
        if self._queue.pending(s) or self._ready(view, s) or tr.busy or tr.queued_micro_batches:
            return []  # not all placed yet, or the trainer has work of the step: no hurry
        batch = view.batch(s)
        live = tuple(t for t in batch if view.status(t) in (TrajStatus.QUEUED, TrajStatus.RUNNING))
        if not live or len(live) > self.config.cut * len(batch):
            return []
        carried = self._cut_from.get(s - 1, ())
        if self._in_micro <= len(carried):
            return []  # none of the step's own trained yet: a cut would move the whole step
        if any(view.status(t) in _OPEN for t in carried):  # (interrupted: waits to resume)
            return []  # the step waits for the tail it carries anyway: cutting gains nothing
        oldest = min(view.trajectory(t).min_version for t in live)
        if oldest >= 0 and s + 1 - oldest > self.config.staleness:
            return []  # (batches are released so that this does not happen; a safety net)
        self._cut_from[s] = frozenset(live)
        self._meter.batch_done(s, view.now)
        return [Interrupt(live, keep_progress=True)] if self.config.cut_stop else []

    # ---------------------------------------------------------------- stealing
    def _steal_tail(self, view: ClusterView) -> list[Command]:
        """``steal``: engines that stay in rollout with nothing to do (consolidation kept
        them) each take the live trajectory predicted longest from the most crowded engine
        that holds at least ``_CROWDED``: the tail then spreads out, where decode is fastest.
        A trajectory is moved at most once (no ping-pong)."""
        if not self.config.steal:
            return []
        loads = view.engine_loads()
        live = (TrajStatus.QUEUED, TrajStatus.RUNNING)
        # an engine that took a trajectory is not idle again until that one is over: its
        # load shows the move only once the context has arrived, and two steals onto one
        # engine (one landing, one in flight) would pile the tail up again
        for e, t in list(self._stolen_to.items()):
            if view.trajectory(t).status not in live:
                del self._stolen_to[e]
        idle = [e for e, load in loads
                if load == 0 and e not in self._stolen_to and not view.engine(e).syncing]
        if not idle or max((load for _, load in loads), default=0) < _CROWDED:
            return []
        by_engine: dict[int, list[tuple[float, str]]] = {}
        for st in range(max(0, self._train_step - 1), self._released):
            for t in view.batch(st):
                info = view.trajectory(t)
                if info.status in live and info.engine is not None and t not in self._stolen:
                    rem = self._predictor.remaining(t, info.task_id, info.turns_done)
                    by_engine.setdefault(info.engine, []).append((rem, t))
        load = dict(loads)
        out: list[Command] = []
        for e in idle:
            donors = [d for d in by_engine if load.get(d, 0) >= _CROWDED and by_engine[d]]
            if not donors:
                break
            d = max(donors, key=lambda x: (load[x], -x))
            by_engine[d].sort()
            _, t = by_engine[d].pop()  # the longest predicted (ties: the highest id)
            self._stolen.add(t)
            self._stolen_to[e] = t
            load[d] -= 1
            out.append(Move((t,), engine=e))
        return out

    def _isolate_tail(self, view: ClusterView, sent: Sequence[Command]) -> list[Command]:
        """``isolate``: a step in its tail (no more than ``_TAIL_PER_ENGINE`` unfinished
        trajectories per rollout engine) spreads them out: each, predicted longest first, moves once to the engine
        with the fewest live trajectories, if it would share that one with fewer than its
        own (an engine's decode slows with every sequence and KV token it holds)."""
        active = view.engine_loads()
        steps = [st for st in range(max(0, self._train_step - 1), self._released)
                 if not self._queue.pending(st) and 0 < view.unfinished(st) <= _TAIL_PER_ENGINE * len(active)]
        if not steps or len(active) < 2:
            return []  # (checked first: it is cheap, and most events are not in a tail)
        leaving = {g for c in sent if isinstance(c, Reassign) for g in c.gpus}
        moved = {t for c in sent if isinstance(c, Move) for t in c.trajectories}
        infos = {e: view.engine(e) for e, _ in active}
        loads = {e: load for e, load in active
                 if not leaving.intersection(infos[e].gpus) and not infos[e].syncing}
        for c in sent:
            if isinstance(c, Move) and c.engine in loads:
                loads[c.engine] += len(c.trajectories)
        # A trajectory on engine e moves only to a load + 1 < loads[e], and every load is at
        # least the lowest: an engine below lowest + 2 never sends one. Moves only narrow the
        # spread, so with none at lowest + 2 nothing moves (the common, balanced case: without
        # this check a seed-scale run, 2 trajectories per engine from the start, spent most of
        # its time ranking and scanning here).
        if len(loads) < 2:
            return []
        lowest = min(loads.values())
        if max(loads.values()) < lowest + 2:
            return []
        live = (TrajStatus.QUEUED, TrajStatus.RUNNING)
        out: list[Command] = []
        for st in steps:
            floor = self._min_version(st)
            tail = [i for i in (view.trajectory(t) for t in view.batch(st))
                    if i.status in live and i.engine is not None and i.id not in self._stolen
                    and i.id not in moved]
            ranked = sorted(((self._predictor.remaining(i.id, i.task_id, i.turns_done), i.id, i.engine)
                             for i in tail), reverse=True)
            for _, t, e in ranked:
                if e not in loads or loads[e] < lowest + 2:
                    continue  # (see above: no engine has room for it with fewer companions)
                cands = [(load, x) for x, load in loads.items() if x != e and infos[x].version >= floor]
                if not cands:
                    continue
                load, f = min(cands)
                if load + 1 >= loads[e]:
                    continue  # (no fewer companions there)
                self._stolen.add(t)
                loads[e] -= 1
                loads[f] += 1
                lowest = min(loads.values())
                out.append(Move((t,), engine=f))
        return out

    # ----------------------------------------------------------- consolidation
    def _consolidate(self, view: ClusterView, tr: TrainerInfo) -> list[Command]:
        """Release engines the live trajectories do not need, if training can use them."""
        if self._opt_sent:
            return []
        s = self._train_step
        if s >= min(self._released, view.num_steps):
            return []
        totals = view.rollout_totals()  # (sums without an EngineInfo per engine per event)
        if not totals.engines:
            return []  # every engine failed (WorkerFailed): nothing to release
        live = totals.live + totals.unbound  # (unpinned work waiting for any engine counts)
        over = live == 0 and all(view.unfinished(x) == 0 for x in range(s, self._released))
        # Rollout over and no GPU trains: unless an engine goes to the trainer now, nothing
        # ever happens again. Training then gets at least one engine.
        stuck = over and not tr.gpus
        floor = self.config.min_engines
        if over and self._released >= view.num_steps:
            floor = 0  # nothing left to roll out in this run
        elif over and self._ahead == 0 and not view.interrupted(s):
            # On-policy and the step's rollout is over: no engine has anything to do until
            # the optimizer step, so every GPU trains (as colocated does).
            floor = 0
        elif stuck:
            floor = min(floor, totals.engines - 1)
        if self._hold and not (over and self._released >= view.num_steps):
            return []  # a held split: the trainer grows to its side only (_grow_to_hold)
        if totals.engines <= floor:
            return []
        if not (self._backlog(view) or (self._in_micro and over)):
            return []  # nothing to train yet: freed GPUs would only wait
        if totals.engines_with_queue or totals.unbound:
            return []  # engines are saturated (KV full): shrinking would only lengthen queues
        oldest = min(range(s, self._released), key=lambda x: (view.unfinished(x) == 0, x))
        if live >= self.config.tail * len(view.batch(oldest)) and not over and self.config.tail < 1.0:
            return []
        # (an engine sent to the trainer earlier in this decision, by _grow_to_hold, is still
        # listed by the view, which does not change while the policy decides: not twice)
        loads = view.engine_loads()
        if self._moving:
            loads = tuple(el for el in loads if self._moving.isdisjoint(view.engine_gpus(el[0])))
        if not loads:
            return []
        ids = [e for e, _ in loads]
        cap = view.engine(ids[0]).kv_capacity
        by_load = math.ceil(live / self._cap)
        by_kv = math.ceil(totals.kv_used / (self.config.kv_limit * cap)) if cap else len(ids)
        if self.config.hedge and self._ahead and not tr.gpus and not self._moving and self._backlog(view) >= live:
            # Do no harm: the trainer starts empty (train_share=0) and forms from engines the
            # tail frees; when none frees (no long tail: every engine still holds a few),
            # training would wait for the batch's end, where a fixed split trains as it goes.
            by_kv = 0
        busy = sum(1 for _, load in loads if load)
        keep = max(floor, min(busy, max(by_load, by_kv)))
        release = len(ids) - keep
        short = tr.min_gpus - len(tr.gpus)  # a trainer below its memory floor runs nothing
        if short > 0 and release * view.tp < short:
            return []  # the engines free now cannot lift it to its floor: they would idle
        if release <= 0:
            return []
        # the least loaded go (of equal loads, the highest ids)
        victims = sorted(loads, key=lambda el: (el[1], -el[0]))[:release]
        gpus = tuple(g for e in sorted(e for e, _ in victims) for g in view.engine_gpus(e))
        if (self._ahead and floor and tr.gpus and short <= 0
                and not self._gains(view, len(tr.gpus), len(gpus))):
            # With staleness the engines must come back for the next batch: a move that
            # saves the trainer less than that switch back loses time (on-policy, every
            # engine goes to training at the step's end anyway: no extra switch).
            return []
        return self._send(view, gpus, Role.TRAIN, Drain(self.config.drain))
