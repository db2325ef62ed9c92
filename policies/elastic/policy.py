"""``elastic``'s reconciliation loop, the :class:`Elastic` policy (the package's docstring
gives the overview): on every event it compares what the cluster does with what it
should do, and issues only the difference.

* **Roll out what the weights allow, spread out, longest first.** Batch s may roll out
  once engines hold weights s-k (``staleness`` k). Its trajectories wait in the policy's
  own queue (:class:`~rlsched.policies.placement.LateQueue`) and are placed one by one on
  the least loaded engine with room (``pack``), the longest predicted first
  (:mod:`~rlsched.policies.predict`: the group's finished siblings and the trajectory's
  own progress; nothing about the future). An engine that empties takes queued work.
* **Give the trainer the GPUs rollout no longer needs, and only when it has work.** An
  engine goes to training when the trainer has finished work waiting and the live
  trajectories fit on the other engines without crowding them (``kv_limit``: decode on
  an engine slows with every token of KV it holds, so the tail is never packed).
* **Take GPUs back when a batch needs them.** When a new batch is released the engines
  it needs for its spread come back from the trainer (:mod:`.reclaim`; as soon as its
  micro-batch ends; while they are on their way, the engines up take only their even
  share of the work in flight, :mod:`.split`);
  with a backlog to train the trainer keeps enough GPUs to train it within
  ``train_within`` of the last batch's rollout time (measured). With staleness k >= 1 a
  trainer of ``train_share`` of the GPUs starts beside the rollout, as async's split does;
  an empty trainer (``train_share=0``) that no freed engine reaches (a flat tail) gets
  one anyway once as much has finished as still runs (``hedge``). ``train_share=0`` and a
  shorter ``train_within`` (0.4: with staleness k the end of step s releases batch
  s+k+1, so the trainer's backlog is on that chain) were 2-11% faster at five of the
  elastic bench's six k=1 points but up to 23% slower on the regime map's long-sequence,
  training-heavy points, so they are not the defaults.

The loop owns the run's progress (batches released, the trainer's step and what of it
was sent) and decides in a fixed order each event: release batches, requeue what was
stopped, grow a held split (:mod:`.hold`), place queued work, reclaim trainer GPUs for it
(:mod:`.reclaim`), cut the tail (:mod:`.cut`), train (:mod:`.training`), release engines to
the trainer (or steal), move queued work off KV-full engines and isolate the tail
(:mod:`.tail`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from operator import itemgetter
from typing import ClassVar

from rlsched.cluster.commands import (
    Command,
    Interrupt,
    OptimizerStep,
    Reassign,
    SetTimer,
    SyncWeights,
    TrainMicroBatch,
)
from rlsched.cluster.events import (
    Event,
    MicroBatchFinished,
    RolesChanged,
    TimerFired,
    TrainStepFinished,
    TrajectoryFinished,
    WeightsSynced,
    WorkerRecovered,
)
from rlsched.cluster.ids import Drain, Role, TrajStatus
from rlsched.cluster.policy import Configured
from rlsched.cluster.view import ClusterView, TrainerInfo

from ..common import (
    idle_engines,
    least_loaded_gpus,
    refresh_new_engines,
    trainer_fills_cluster,
    usable,
)
from ..meter import Meter
from ..placement import LateQueue, per_engine_cap
from ..predict import LengthPredictor
from ..registry import register
from .config import ElasticConfig
from .cut import CutLedger
from .hold import FixedSplit
from .reclaim import Reclaim
from .split import share_while_coming
from .switches import Switches
from .tail import TailSpreader
from .training import MicroBatch, Training

_LOAD = itemgetter(1)  # (engine, load) -> load
_SETTLE = "elastic-settle"  # (``settle``'s timer)


@register
class Elastic(FixedSplit, Reclaim, Configured):
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
        self._queue = LateQueue()
        self._predictor = self._lengths()
        self._cap = 1
        self._even = 1  # the cap of an even spread (pack=1): how many engines a batch needs
        self._meter = Meter()
        self._switches = Switches(self._meter)  # the Reassigns under way
        self._training = Training(self.config, self._meter)
        self._tail = TailSpreader(self._predictor)  # (steal, isolate: moves once each)
        self._cuts = CutLedger()  # what each step trains, given the tails cut (``cut``)
        self._hold = 0  # GPUs of the trainer's side of a held fixed split (0: none held)
        self._settling = False  # (``settle``: a timer at the instant of a finish is pending)

    # ------------------------------------------------------------------ events
    def on_event(self, event: Event, view: ClusterView) -> Sequence[Command]:
        cmds: list[Command] = []
        self._switches.decision()
        match event:
            case RolesChanged(gpus=gpus, role=Role.ROLLOUT):
                self._switches.arrive(gpus, Role.ROLLOUT, view)
                cmds += refresh_new_engines(view, gpus)
            case RolesChanged(gpus=gpus, role=role):
                self._switches.arrive(gpus, role, view)
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
            case TimerFired(tag=tag) if tag == _SETTLE:
                self._settling = False
            case WeightsSynced():
                pass
        tr = view.trainer()  # (the view does not change while the policy decides)
        if isinstance(event, (WorkerRecovered, RolesChanged)) and view.gpus_in(Role.IDLE):
            back = idle_engines(view)  # failures left whole engines idle: roll out again
            if back and view.gpus_in(Role.ROLLOUT) + view.gpus_in(Role.TRAIN):
                cmds += self._send(view, back, Role.ROLLOUT)
            cmds += self._lift_trainer(view, tr, frozenset(back))
        elif isinstance(event, TrajectoryFinished) and 0 < len(tr.gpus) < tr.min_gpus:
            cmds += self._lift_trainer(view, tr, frozenset())  # (the rollout may just have ended)
        # (TRAIN first: the trainer's record below lists it anyway, and a trainer is up on
        # most events, so the rollout GPUs, up to a thousand at seed scale, are rarely listed)
        if self._switches.pending == 0 and not view.gpus_in(Role.TRAIN) and not view.gpus_in(Role.ROLLOUT):
            gpus = usable(view, Role.ROLLOUT)  # (every GPU, unless some failed)
            if gpus:  # start of the run: every GPU rolls out (with staleness, but a trainer)
                return cmds + self._start(view, gpus)
        self._release_batches(view, tr)
        self._requeue_interrupted(view)
        grow = self._grow_to_hold(view, tr)
        cmds += grow
        coming = self._switches.coming(view)
        cap = self._cap
        if coming:  # (engines on their way to rollout: those up take only their share)
            totals = view.rollout_totals()
            cap = share_while_coming(cap, totals.live + totals.unbound + len(self._queue),
                                     len(view.engines()), coming // view.tp, self.config.pack)
        placed = self._queue.place(view, cap, self._min_version,
                                   self._predictor.remaining if self.config.order == "longest" else None,
                                   hold=coming // view.tp,
                                   skip=self._switches.engines_sent(view),
                                   unpinned=trainer_fills_cluster(view, tr))
        cmds += placed
        cmds += self._reclaim(view, tr)
        cmds += self._cut_tail(view, tr)
        leaving = {g for c in cmds if isinstance(c, Reassign) and c.role is not Role.TRAIN for g in c.gpus}
        step: MicroBatch | OptimizerStep | None = None
        if not leaving or leaving.isdisjoint(tr.gpus):
            # (a micro-batch queued while the trainer's GPUs are being handed back would
            # start on whatever GPUs it gets later: wait until it has them)
            step = self._train(view, tr)
            if isinstance(step, MicroBatch) and self._waits_to_settle(event):
                step = None
                cmds += self._settle(view)
        # let new work settle before releasing engines -- work that waits for weights the
        # trainer has yet to make (a cut trajectory queued for the next step) does not: the
        # trainer needs GPUs to make them (else a stall: the fault sweep, 12 GPUs of tp 2,
        # cut_stop, seed 1 -- a failure took the trainer's GPUs to rollout, the step's tail
        # was then cut, and its optimizer step waited for GPUs consolidation never freed)
        if not placed and (not self._queue or all(self._min_version(st) > tr.version
                                                  for st in self._queue.steps())):
            released = self._consolidate(view, tr)
            if isinstance(step, MicroBatch) and step.whole and any(
                    isinstance(c, Reassign) and c.role is Role.TRAIN for c in released):
                # a step trained whole assumed no GPU would join: those just sent will, so it
                # is sized again for them (ending before they arrive, or waiting: ``join``)
                step = self._train(view, tr)
            if isinstance(step, MicroBatch) and self._training.withhold(
                    view, len(tr.gpus), step, released, self._switches.to_train):
                step = None  # (``join``: it starts when the engines released to it arrive)
            cmds += self._trained(view, tr, step) + (released or self._steal(view, cmds))
        else:
            cmds += self._trained(view, tr, step)
        if self.config.rebalance:
            cmds += self._tail.rebalance(view, self._rolling(), self._ahead, cmds)
        if self.config.isolate and isinstance(event, (TrajectoryFinished, RolesChanged)):
            cmds += self._tail.isolate(view, self._rolling(), self._queue, self._ahead, cmds)
        return cmds

    def _waits_to_settle(self, event: Event) -> bool:
        """Does a micro-batch wait for the end of the instant (``settle``)? While a timer
        is pending, whatever the event; else on a finish, with ``settle`` or while
        ``settle_auto`` has seen no length spread."""
        if self._settling:
            return True
        return isinstance(event, TrajectoryFinished) and (
            self.config.settle or (self.config.settle_auto and self._predictor.no_spread_seen()))

    def _settle(self, view: ClusterView) -> list[Command]:
        """``settle``: the micro-batch a trajectory's finish would start waits for the end of
        the instant -- a timer at ``now``, which the driver delivers after the events of this
        instant already due, so siblings that finish at the same time are all ready when it
        fires (its decision starts the micro-batch). Events arrive one at a time, and a
        trainer that is idle when the first of a batch's simultaneous finishes arrives
        trains it alone: on a trace with no length spread, one gradient reduction more per
        step, and its timing (mostly that fixed part) overstated the training left ~10x,
        so moves were sent that could not pay. One timer at a time: while one is pending
        no micro-batch starts, whatever the event (until 2026-12 only a finish waited, and
        an engine's idle event at the same instant started a micro-batch of the few
        finishes seen so far: 8 of 48 on 8 engines, the rest queued behind it).
        ``settle_auto`` (the default) does the same while every trajectory finished so far
        had one length (``no_spread_seen``): where a batch does finish at once, and on a
        long-tailed trace for the run's first finish only."""
        if self._settling:
            return []
        self._settling = True
        return [SetTimer(view.now, _SETTLE)]

    def _rolling(self) -> range:
        """The steps in flight, whose trajectories may still be placed, moved or trained: the
        trainer's step (and the one before it, whose cut tail it carries) to the last released."""
        return range(max(0, self._train_step - 1), self._released)

    def _lift_trainer(self, view: ClusterView, tr: TrainerInfo, sent: frozenset[int]) -> list[Command]:
        """A trainer left below its memory floor by a failure runs nothing. GPUs back from
        failures that make no whole engine (their partners are in the trainer) join it when
        no engine can leave rollout to lift it: on a cluster of the floor's size (no engine
        rolls out beside it), or when nothing rolls out at all. Otherwise it waited for a
        consolidation that never came: with GPU failures every elastic run stalled on 8
        GPUs of the default preset (floor 8), and 28 of 80 on 12 and 16 GPUs of tp 4 (now
        3). While work rolls out, consolidation lifts it with whole engines, as before (this
        rule there too moved the fingerprint's fault runs by -16% to +22%). A rollout that
        ends with the trainer still short lifts it too (its last trajectory's finish): a
        cluster of the floor and one engine has no engine to spare for it (a stall under the
        fault sweep, 12 GPUs, seeds 0 and 5). Work left to roll out includes trajectories
        stopped and not yet requeued (this decision requeues them later)."""
        have = len(tr.gpus) + self._switches.to_trainer(view)
        if not tr.gpus or have >= tr.min_gpus:
            return []
        if not trainer_fills_cluster(view, tr):
            totals = view.rollout_totals()
            if (totals.live + totals.unbound or self._queue
                    or any(view.interrupted(s) for s in self._rolling())):
                return []  # (work rolls out: consolidation lifts it with whole engines)
        failed = set(view.failed_gpus())
        spare = tuple(g for g in view.gpus_in(Role.IDLE)
                      if g not in failed and g not in sent and g not in self._switches.moving)
        return self._send(view, spare, Role.TRAIN) if spare else []

    def _steal(self, view: ClusterView, sent: Sequence[Command]) -> list[Command]:
        """``steal``: engines consolidation kept idle take work off crowded ones (:mod:`.tail`),
        but none sent out of rollout in this decision (``_grow_to_hold``'s), and none of the
        trajectories ``sent`` interrupts (``cut_stop``)."""
        if not self.config.steal:
            return []
        stopped = frozenset(t for c in sent if isinstance(c, Interrupt) for t in c.trajectories)
        return self._tail.steal(view, self._rolling(), self._ahead, self._switches.engines_sent(view), stopped)

    def _send(self, view: ClusterView, gpus: tuple[int, ...], role: Role,
              drain: Drain = Drain.MIGRATE) -> list[Command]:
        """The Reassign of ``gpus`` to ``role`` (the loop's one way to send one: recorded)."""
        return self._switches.send(view, gpus, role, drain)

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

    def _min_version(self, step: int) -> int:
        return step - self._ahead

    # ----------------------------------------------------------------- rollout
    def _release_batches(self, view: ClusterView, tr: TrainerInfo) -> None:
        """Queue every batch the trainer's weights allow (s - k <= version)."""
        last = min(tr.version + self._ahead, view.num_steps - 1)
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
        for s in self._rolling():
            stopped = view.interrupted(s)
            if stopped:
                cut = self._cuts.cut_from(s)
                self._queue.add(s, tuple(t for t in stopped if t not in cut), front=True)
                # (a cut one resumes with the step that trains it, on its weights)
                self._queue.add(s + 1, tuple(t for t in stopped if t in cut), front=True)

    # ---------------------------------------------------------------- training
    def _train(self, view: ClusterView, tr: TrainerInfo) -> MicroBatch | OptimizerStep | None:
        """The trainer's next command for its step: a micro-batch of what has finished (sent
        and counted by :meth:`_trained`, unless ``join`` withholds it), or the optimizer step
        after the step's last (sent: consolidation, later in the decision, sees it)."""
        s = self._train_step
        if s >= view.num_steps or s >= self._released or self._opt_sent:
            return None
        if not tr.gpus or tr.queued_micro_batches or tr.busy:
            return None  # (sent to an idle trainer: its duration is measured)
        if any(t <= self._switches.arrived for t in self._switches.to_train.values()):
            return None  # GPUs sent with those that just joined end their switch now too: wait
        ready = self._cuts.ready(view, s)
        if ready:
            # (no GPU can join a later micro-batch -- none on its way, and either nothing
            # more of the step is to come and nothing rolls out, or a held split's trainer
            # is at its side: see Training.micro_batch and _rollout_idle)
            more = self._cuts.unfinished(view, s, self._queue) > 0
            whole = not self._switches.to_train and (
                (not more and self._rollout_idle(view) and self._measured(view, tr))
                or 0 < self._hold == len(tr.gpus))
            return self._training.micro_batch(view, len(tr.gpus), ready, self._switches.to_train, whole, more)
        if self._cuts.unfinished(view, s, self._queue) == 0 and self._in_micro == self._cuts.size(view, s):
            self._opt_sent = True
            return OptimizerStep()
        return None

    def _measured(self, view: ClusterView, tr: TrainerInfo) -> bool:
        """May a step go whole now: is the trainer's speed measured, or does it hold at least
        as many GPUs as rollout (a move of every engine would at most halve the step)?
        Consolidation moves GPUs only at a measured training rate, so a step sent whole
        before any micro-batch was timed kept the trainer it had for all of it: the flat
        cost model, 8 engines of tp 2 and a trainer of 4 GPUs trained a 48-trajectory step
        whole in 40.7 s, where a first micro-batch of 4 (3.4 s) measured the rate and
        brought 10 GPUs that finished the step 21 s sooner. That probe costs one gradient
        reduction more; with the trainer at half the GPUs or more (``train_share=0.5``)
        it bought nothing on the ``uniform`` samples and cost 0.3-0.5 s in most cases."""
        if self._meter.train_gpu_s_per_token is not None:
            return True
        return len(view.engines()) * view.tp <= len(tr.gpus)

    def _rollout_idle(self, view: ClusterView) -> bool:
        """Nothing rolls out or waits to (no engine, or none holds a live trajectory and
        none is queued): no engine can empty and join the trainer before its next
        micro-batch ends, so a step whose rollout is over trains in one micro-batch. Until
        2026-12 that took no engine in rollout at all, and with staleness, where engines stay
        up idle for the next batch's weights, a step that finished at once was trained in
        micro-batches of one trajectory per GPU, each paying a gradient reduction (uniform
        lengths, 32 GPUs of tp 8: three micro-batches of 16 on 16 GPUs, 6.5 s, where async
        trains the step in one). GPUs that consolidation sends to the trainer in the same
        decision re-size it (:meth:`on_event`)."""
        if not view.engines():
            return True
        totals = view.rollout_totals()
        return not (totals.live or totals.unbound or self._queue)

    def _trained(self, view: ClusterView, tr: TrainerInfo,
                 step: MicroBatch | OptimizerStep | None) -> list[Command]:
        """The command of :meth:`_train` that is sent; a micro-batch is counted here."""
        if isinstance(step, MicroBatch):
            self._in_micro += len(step.trajectories)
            self._meter.micro_batch_sent(len(tr.gpus), step.tokens, view.now)
            return [TrainMicroBatch(step.trajectories)]
        return [step] if step is not None else []

    # ----------------------------------------------------------------- cutting
    def _cut_tail(self, view: ClusterView, tr: TrainerInfo) -> list[Command]:
        """``cut`` the tail of the trainer's step (:meth:`CutLedger.cut`) once the trainer has
        trained all of the step it can; with ``cut_stop`` the cut trajectories are
        interrupted keeping their finished turns (resumed with the next step's batch)."""
        s = self._train_step
        if not self._cutting or s >= self._released or self._opt_sent:
            return []
        if self._queue.pending(s) or self._cuts.ready(view, s) or tr.busy or tr.queued_micro_batches:
            return []  # not all placed yet, or the trainer has work of the step: no hurry
        live = self._cuts.cut(view, s, self.config.cut, self.config.staleness, self._in_micro)
        if not live:
            return []
        self._meter.batch_done(s, view.now)
        return [Interrupt(live, keep_progress=True)] if self.config.cut_stop else []

    # ----------------------------------------------------------- consolidation
    def _consolidate(self, view: ClusterView, tr: TrainerInfo) -> list[Command]:
        """Release engines the live trajectories do not need, if training can use them."""
        if self._opt_sent and (len(tr.gpus) + self._switches.to_trainer(view) >= tr.min_gpus
                               or not (tr.queued_micro_batches or tr.queued_optimizer_steps)):
            # (the step's training is all sent -- unless failures left the trainer below its
            # memory floor with its jobs queued: then it needs GPUs like any empty trainer,
            # or the run stalls, as it did under the fault sweep, 12 GPUs, seed 36 (emptied),
            # and 8 GPUs of tp 1, seed 1 (a GPU back from a failure made an engine of its own
            # and stayed in rollout, the trainer one short of its floor of 8))
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
        last = over and self._released >= view.num_steps  # (the run's last rollout is over)
        floor = self.config.min_engines
        if last:
            floor = 0  # nothing left to roll out in this run
        elif over and self._ahead == 0 and not view.interrupted(s):
            # On-policy and the step's rollout is over: no engine has anything to do until
            # the optimizer step, so every GPU trains (as colocated does).
            floor = 0
        elif stuck:
            floor = min(floor, totals.engines - 1)
        # a trainer below its memory floor runs nothing; GPUs on their way to it count (an
        # engine emptied a moment after the others waited for them to arrive, then switched:
        # a second switch on the critical path, every step)
        short = tr.min_gpus - len(tr.gpus) - self._switches.to_trainer(view)
        if over and floor and short > 0 and (totals.engines - floor) * view.tp < short:
            # the engines min_engines keeps are what the trainer's memory floor needs (a
            # cluster smaller than the floor and an engine): with nothing live they all go,
            # or no step would ever train (a stall, found on 8 GPUs of the default preset)
            floor = max(0, totals.engines - -(-short // view.tp))
        if self._hold and not last:
            return []  # a held split: the trainer grows to its side only (_grow_to_hold)
        if totals.engines <= floor:
            return []
        if totals.engines_with_queue or totals.unbound:
            return []  # engines are saturated (KV full): shrinking would only lengthen queues
        steps = self._rolling()
        if not (self._training.backlog(view, steps) or (self._in_micro and over)):
            return []  # nothing to train yet: freed GPUs would only wait
        if self.config.tail < 1.0 and not over:
            oldest = min(range(s, self._released), key=lambda x: (view.unfinished(x) == 0, x))
            if live >= self.config.tail * len(view.batch(oldest)):
                return []
        # (an engine sent to the trainer earlier in this decision, by _grow_to_hold, is still
        # listed by the view, which does not change while the policy decides: not twice)
        loads = view.engine_loads()
        if self._switches.sent_now:
            gone = self._switches.engines_sent(view)
            loads = tuple(el for el in loads if el[0] not in gone)
        if not loads:
            return []
        cap = view.engine(loads[0][0]).kv_capacity
        by_load = math.ceil(live / self._cap)
        by_kv = math.ceil(totals.kv_used / (self.config.kv_limit * cap)) if cap else len(loads)
        if (self.config.hedge and self._ahead and not tr.gpus and not self._switches.moving
                and self._training.backlog(view, steps) >= live):
            # Do no harm: the trainer starts empty (train_share=0) and forms from engines the
            # tail frees; when none frees (no long tail: every engine still holds a few),
            # training would wait for the batch's end, where a fixed split trains as it goes.
            by_kv = 0
        busy = len(loads) - list(map(_LOAD, loads)).count(0)  # (engines with a load; in C)
        keep = max(floor, min(busy, max(by_load, by_kv)))
        release = len(loads) - keep
        if short > 0 and release * view.tp < short:
            return []  # the engines free now cannot lift it to its floor: they would idle
        # only engines the trainer can use: GPUs beyond its whole units idle there, while in
        # rollout they serve the tail (12 GPUs of tp 2, floor 8 growing by 4: a trainer
        # emptied by a new batch took 5 engines back, 2 GPUs of them idle, and packed the
        # tail onto the one engine left; 8.8% behind the best async, now 5.4% ahead)
        have = len(tr.gpus) + self._switches.to_trainer(view)
        while release > 0 and tr.uses(have + (release - 1) * view.tp) == tr.uses(have + release * view.tp):
            release -= 1
        if release <= 0:
            return []
        gpus = least_loaded_gpus(view, loads, release)
        if (self._ahead and (floor or last) and tr.gpus and short <= 0
                and not self._training.gains(view, steps, len(tr.gpus), len(gpus), back=not last)):
            # With staleness the engines must come back for the next batch: a move that
            # saves the trainer less than that switch back loses time (on-policy, every
            # engine goes to training at the step's end anyway: no extra switch). After the
            # run's last rollout none comes back, but a move must still save time: GPUs
            # that arrive after the trainer is done only split its work into more
            # micro-batches (uniform lengths, 32 GPUs of tp 8: the last step 10.9 s where
            # 7.2 s on the trainer it had).
            return []
        return self._send(view, gpus, Role.TRAIN, Drain(self.config.drain))
