"""``partial``: synchronous RL with partial rollout (Kimi k1.5 / APRIL style).

Like ``colocated``, every GPU rolls out, then every GPU trains. But a step does not wait
for its slowest trajectories: once ``finish_fraction`` of the step's trajectories have
finished (or ``budget_s`` seconds have passed, if set), the rest are interrupted, keeping
every finished turn. By ``mode`` they are then

* ``resume``: dispatched again with the next step's batch, continuing from their last
  finished turn, and trained with that step (their early tokens are then 1 version old:
  staleness 1). A resumed trajectory is never interrupted again, and the last step
  interrupts nothing, so every trajectory is trained exactly once;
* ``train``: trained now as partial trajectories (staleness 0, fewer tokens);
* ``drop``: dropped (counted as wasted in the run record, never silently).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlsched.cluster.commands import Command, Dispatch, Drop, Interrupt, Reassign, SetTimer, Train
from rlsched.cluster.events import (
    Event,
    RolesChanged,
    RunStarted,
    TimerFired,
    TrainStepFinished,
    TrajectoryFinished,
    WorkerRecovered,
)
from rlsched.cluster.ids import Role, TrajStatus
from rlsched.cluster.policy import Configured, param
from rlsched.cluster.view import ClusterView

from .common import Retries, phase_is_stuck, usable
from .registry import register

_ACTIVE = (TrajStatus.QUEUED, TrajStatus.RUNNING)


@dataclass(frozen=True)
class PartialConfig:
    finish_fraction: float = param("float", 0.75, "interrupt the rest once this share of the "
                                   "step's trajectories finished", low=0.05, high=1.0)
    budget_s: float = param("float", 0.0, "also interrupt after this many seconds of rollout "
                            "(0: no time budget)", low=0.0, high=1e7)
    mode: str = param("choice", "resume", "what happens to interrupted trajectories",
                      choices=("resume", "train", "drop"), tunable=False)


@register
class Partial(Configured):
    name: ClassVar[str] = "partial"
    Config = PartialConfig
    config: PartialConfig

    @property
    def max_staleness(self) -> int:
        return 1 if self.config.mode == "resume" else 0

    @property
    def defers(self) -> bool:
        return self.config.mode == "resume"

    def reset(self, view: ClusterView, rng: random.Random) -> None:
        self._step = 0
        self._rolling_out = False
        self._cut = False
        self._budget_passed = False
        self._carried: tuple[str, ...] = ()  # interrupted in the previous step, resumed now
        # the carried trajectories not finished since this step dispatched them: a set kept
        # per event, because rescanning the carried ones on every finish was O(batch^2) a step
        self._carried_open: set[str] = set()
        # worker failures (see policies.common): what this policy cut itself vs. what a
        # failed GPU stopped (resumed at once elsewhere), and one dispatch/train per step
        self._cut_ids: frozenset[str] = frozenset()
        self._retry = Retries()
        self._phase = Role.ROLLOUT
        self._dispatched = -1
        self._trained = -1

    def on_event(self, event: Event, view: ClusterView) -> Sequence[Command]:
        match event:
            case RunStarted():
                return [Reassign(usable(view, Role.ROLLOUT), Role.ROLLOUT)]
            case WorkerRecovered() | RolesChanged() if phase_is_stuck(view, self._phase, self._step):
                # failures left the phase without a GPU and nothing is switching (also when
                # the step's rollout ended while a failure's reassign had every GPU failed
                # or switching, so the move to training found none): move there now
                return self._to(self._phase, view)
            case RolesChanged(role=Role.ROLLOUT):
                cmds: list[Command] = []
                if self._phase is Role.ROLLOUT and self._dispatched < self._step and view.engines():
                    self._dispatched = self._step
                    self._rolling_out, self._cut, self._budget_passed = True, False, False
                    self._cut_ids = frozenset()
                    self._carried_open = set(self._carried)
                    cmds.append(Dispatch(self._carried + view.batch(self._step)))
                    if self.config.budget_s > 0:
                        cmds.append(SetTimer(view.now + self.config.budget_s, f"budget-{self._step}"))
                return cmds + self._retry.flush(view)
            case TrajectoryFinished(trajectory=t, status=TrajStatus.INTERRUPTED) if t not in self._cut_ids:
                return self._retry.stopped(t, view)  # a failed GPU: resume it elsewhere
            case TimerFired(tag=tag) if self._rolling_out and tag == f"budget-{self._step}":
                self._budget_passed = True
                return self._interrupt_rest(view) + self._maybe_train(view)
            case TrajectoryFinished(trajectory=t) if self._rolling_out:
                self._carried_open.discard(t)
                cmds = []
                batch = view.batch(self._step)
                done = len(batch) - view.unfinished(self._step)
                if self._budget_passed or done >= self.config.finish_fraction * len(batch):
                    cmds += self._interrupt_rest(view)
                return cmds + self._maybe_train(view)
            case RolesChanged(role=Role.TRAIN) if self._phase is Role.TRAIN and self._trained < self._step:
                self._trained = self._step
                return self._train(view)
            case TrainStepFinished(version=v):
                self._step = v
                if v < view.num_steps:
                    self._phase = Role.ROLLOUT
                    return self._to(Role.ROLLOUT, view)
        return []

    def _to(self, role: Role, view: ClusterView) -> list[Command]:
        gpus = usable(view, role)  # (every GPU not in ``role``, unless some failed)
        if gpus:
            return [Reassign(gpus, role)]
        if role is Role.TRAIN and view.trainer().gpus and self._trained < self._step:
            self._trained = self._step  # (GPUs left in TRAIN by a failure: train there)
            return self._train(view)
        return []  # nothing usable: wait for a WorkerRecovered

    def _interrupt_rest(self, view: ClusterView) -> list[Command]:
        last = self._step == view.num_steps - 1
        batch = view.batch(self._step)
        if self._cut or (last and self.config.mode == "resume") or view.unfinished(self._step) == len(batch):
            return []  # never cut a step before one of its trajectories finished
        self._cut = True
        live = tuple(t for t in view.batch(self._step) if view.trajectory(t).status in _ACTIVE)
        self._cut_ids = frozenset(live)
        return [Interrupt(live)] if live else []

    def _maybe_train(self, view: ClusterView) -> list[Command]:
        # (a carried trajectory a failed GPU stopped stays open: it is resumed, and
        # self._retry holds the step meanwhile)
        if view.unfinished(self._step) == 0 and not self._carried_open and not self._retry:
            # unfinished() counts interrupted trajectories as finished
            self._rolling_out = False
            self._phase = Role.TRAIN
            return self._to(Role.TRAIN, view)
        return []

    def _train(self, view: ClusterView) -> list[Command]:
        batch = set(view.batch(self._step)) | set(self._carried)
        ready = [t for t in view.finished() if t in batch]
        stopped = tuple(t for t in ready if view.trajectory(t).status is TrajStatus.INTERRUPTED)
        done = tuple(t for t in ready if view.trajectory(t).status is not TrajStatus.INTERRUPTED)
        cmds: list[Command] = []
        self._carried = ()
        if self.config.mode == "resume":
            self._carried = stopped
        elif self.config.mode == "train":
            done = done + stopped
        elif stopped:
            cmds.append(Drop(stopped))
        cmds.append(Train(done))  # non-empty: a step is only cut after a trajectory finished
        return cmds
