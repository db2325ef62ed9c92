"""``colocated``: synchronous, on-policy RL on one pool of GPUs (verl's default mode).

Every GPU rolls out the step's batch; when the last trajectory finishes, every GPU
switches to training, takes one optimizer step on the whole batch, and switches back
(the switch reloads the new weights, so no separate sync is needed). Staleness is 0;
the cost is that the whole cluster waits for the slowest trajectory of every step.

Worker failures: trajectories on a failed engine resume on the remaining ones
(:class:`~rlsched.policies.common.Retries`); phases move only working GPUs and whole engines
(:func:`~rlsched.policies.common.usable`), so a recovered GPU rejoins at the next phase.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlsched.cluster.commands import Command, Dispatch, Reassign, Train
from rlsched.cluster.events import (
    Event,
    RolesChanged,
    RunStarted,
    TrainStepFinished,
    TrajectoryFinished,
    WorkerRecovered,
)
from rlsched.cluster.ids import Role, TrajStatus
from rlsched.cluster.policy import Configured
from rlsched.cluster.view import ClusterView

from .common import Retries, phase_is_stuck, usable
from .registry import register


@dataclass(frozen=True)
class ColocatedConfig:
    """``colocated`` has no parameters."""


@register
class Colocated(Configured):
    name: ClassVar[str] = "colocated"
    Config = ColocatedConfig
    config: ColocatedConfig
    max_staleness = 0
    defers = False

    def reset(self, view: ClusterView, rng: random.Random) -> None:
        self._step = 0
        self._rolling_out = False
        self._phase = Role.ROLLOUT  # the role the cluster is in (or switching to)
        self._dispatched = -1  # last step whose batch was dispatched
        self._trained = -1  # last step whose Train was sent
        self._retry = Retries()

    def on_event(self, event: Event, view: ClusterView) -> Sequence[Command]:
        # Events are delivered one by one after the state has moved on, so several
        # TrajectoryFinished events may all see the step complete: the phase flag makes
        # the switch to training happen exactly once.
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
                    self._rolling_out = True
                    cmds.append(Dispatch(view.batch(self._step)))
                return cmds + self._retry.flush(view)
            case TrajectoryFinished(trajectory=t, status=TrajStatus.INTERRUPTED):
                return self._retry.stopped(t, view)  # a failed GPU: resume it elsewhere
            case TrajectoryFinished() if (
                self._rolling_out and view.unfinished(self._step) == 0 and not self._retry
            ):
                self._rolling_out = False
                self._phase = Role.TRAIN
                return self._to(Role.TRAIN, view)
            case RolesChanged(role=Role.TRAIN) if self._phase is Role.TRAIN and self._trained < self._step:
                self._trained = self._step
                return [Train(view.finished(self._step))]
            case TrainStepFinished(version=v):
                self._step = v
                if v < view.num_steps:
                    self._phase = Role.ROLLOUT
                    return self._to(Role.ROLLOUT, view)
        return []

    def _to(self, role: Role, view: ClusterView) -> list[Command]:
        gpus = usable(view, role)
        if gpus:
            return [Reassign(gpus, role)]
        if role is Role.TRAIN and view.trainer().gpus and self._trained < self._step:
            self._trained = self._step  # (GPUs left in TRAIN by a failure: train there)
            return [Train(view.finished(self._step))]
        return []  # nothing usable: wait for a WorkerRecovered
