"""``colocated``: synchronous, on-policy RL on one pool of GPUs (verl's default mode).

Every GPU rolls out the step's batch; when the last trajectory finishes, every GPU
switches to training, takes one optimizer step on the whole batch, and switches back
(the switch reloads the new weights, so no separate sync is needed). Staleness is 0;
the cost is that the whole cluster waits for the slowest trajectory of every step.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

from rlsched.cluster.commands import Command, Dispatch, Reassign, Train
from rlsched.cluster.events import (
    Event,
    RolesChanged,
    RunStarted,
    TrainStepFinished,
    TrajectoryFinished,
)
from rlsched.cluster.ids import Role
from rlsched.cluster.policy import Param
from rlsched.cluster.view import ClusterView

from .common import all_gpus
from .registry import register


@register
class Colocated:
    name: ClassVar[str] = "colocated"
    params: ClassVar[tuple[Param, ...]] = ()
    max_staleness = 0
    defers = False

    def __init__(self) -> None:
        self._step = 0
        self._rolling_out = False

    def reset(self, view: ClusterView, rng: random.Random) -> None:
        self._step = 0
        self._rolling_out = False

    def on_event(self, event: Event, view: ClusterView) -> Sequence[Command]:
        # Events are delivered one by one after the state has moved on, so several
        # TrajectoryFinished events may all see the step complete: the phase flag makes
        # the switch to training happen exactly once.
        match event:
            case RunStarted():
                return [Reassign(all_gpus(view), Role.ROLLOUT)]
            case RolesChanged(role=Role.ROLLOUT):
                self._rolling_out = True
                return [Dispatch(view.batch(self._step))]
            case TrajectoryFinished() if self._rolling_out and view.unfinished(self._step) == 0:
                self._rolling_out = False
                return [Reassign(all_gpus(view), Role.TRAIN)]
            case RolesChanged(role=Role.TRAIN):
                return [Train(view.finished(self._step))]
            case TrainStepFinished(version=v):
                self._step = v
                if v < view.num_steps:
                    return [Reassign(all_gpus(view), Role.ROLLOUT)]
        return []
