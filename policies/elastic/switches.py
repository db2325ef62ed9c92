"""``elastic``'s role switches in flight: the ``Reassign`` commands the policy has sent and
the driver has not yet reported done.

The view shows a GPU's role, not where the policy sent it, and a driver reports a switch's
end late (a new engine's ``EngineIdle`` comes before its ``RolesChanged``, and an idle
engine may be sent on to the trainer at once), or never (a failure took it out of its
switch). :class:`Switches` keeps what the policy sent, matches each report to the switch it
ends, and times every switch with the policy's :class:`~rlsched.policies.meter.Meter`.
"""

from __future__ import annotations

from rlsched.cluster.commands import Command, Reassign
from rlsched.cluster.ids import Drain, Role
from rlsched.cluster.view import ClusterView

from ..meter import Meter


def switching_to_train(view: ClusterView, key: tuple[int, ...]) -> bool:
    """Is a group sent to the trainer still on its way (a GPU of it switching, not
    failed)? A group a failure took out of its switch never reports its arrival."""
    failed = set(view.failed_gpus())
    return any(view.role(g) is Role.SWITCHING and g not in failed for g in key)


class Switches:
    """The Reassigns under way (fields read by the loop; changed only through the methods)."""

    def __init__(self, meter: Meter) -> None:
        self._meter = meter
        self.pending = 0  # Reassign commands not yet reported by RolesChanged
        self.to_rollout: set[int] = set()  # GPUs sent to rollout, not yet there
        self.moving: set[int] = set()  # GPUs of Reassigns not yet reported by RolesChanged
        self.sent_now: set[int] = set()  # GPUs of Reassigns sent in the decision under way
        self.to_train: dict[tuple[int, ...], float] = {}  # GPUs switching to train: issued at
        self.arrived = -1.0  # when the newest group that joined the trainer was sent

    def decision(self) -> None:
        """A new decision starts (nothing sent in it yet)."""
        self.sent_now.clear()

    def engines_sent(self, view: ClusterView) -> frozenset[int]:
        """Engines of the GPUs sent in the decision under way. The view does not change while
        the policy decides, so it still lists them in their old role (an engine sent to the
        trainer still rolls out, idle): nothing may be placed on, stolen onto or released
        from them again in this decision."""
        return frozenset(view.engine_of(g) for g in self.sent_now)

    def send(self, view: ClusterView, gpus: tuple[int, ...], role: Role,
             drain: Drain = Drain.MIGRATE) -> list[Command]:
        """The Reassign of ``gpus`` to ``role``, recorded as under way."""
        self.pending += 1
        self.moving.update(gpus)
        self.sent_now.update(gpus)
        if role is Role.ROLLOUT:
            self.to_rollout.update(gpus)
        else:
            # (sent on elsewhere before reaching rollout -- back to the trainer after a failure
            # emptied it: no longer coming. Counted as coming for good while the trainer held
            # them, they kept an engine's share of the last trajectory from the engines up: a
            # stall under the fault sweep, 24 GPUs, seed 6)
            self.to_rollout.difference_update(gpus)
            if role is Role.TRAIN:
                self.to_train[gpus] = view.now
        self._meter.switch_sent(gpus, view.now, role)
        return [Reassign(gpus, role, drain)]

    def arrive(self, gpus: tuple[int, ...], role: Role, view: ClusterView) -> None:
        """GPUs of a Reassign finished their switch to ``role``. A driver may report it
        after the policy sent the same GPUs on to another role (a new engine's EngineIdle
        comes before its RolesChanged, and an idle engine may go to the trainer at once):
        that second switch is still under way, so only what was sent to ``role`` ends."""
        self.pending -= 1
        arrived = set(gpus)
        on_way = set()  # (GPUs sent on to another role meanwhile: switching still)
        if role is not Role.ROLLOUT:
            on_way.update(g for g in self.to_rollout if view.role(g) is Role.SWITCHING)
        for key in [k for k in self.to_train if arrived.intersection(k)]:
            if role is not Role.TRAIN and switching_to_train(view, key):
                on_way.update(key)
                continue
            # (a failure may have taken some of a group's GPUs: match by overlap)
            self.arrived = max(self.arrived, self.to_train.pop(key))
        self.moving.difference_update(g for g in gpus if g not in on_way)
        if role is Role.ROLLOUT:
            self.to_rollout.difference_update(gpus)
        self._meter.switch_done(gpus, view.now, role)

    def to_trainer(self, view: ClusterView) -> int:
        """GPUs on their way to the trainer (switching to it, not failed): they count toward
        its memory floor before they arrive. One a failure took out of its switch never
        arrives (its group's report may name no GPU): counted, it kept a trainer one GPU
        short of its floor from being lifted by the GPUs back from failures, for good (the
        fault sweep, 8 GPUs, seed 48)."""
        if not self.to_train:
            return 0
        failed = set(view.failed_gpus())
        return sum(1 for k in self.to_train for g in k
                   if view.role(g) is Role.SWITCHING and g not in failed)

    def coming(self, view: ClusterView) -> int:
        """GPUs on their way to rollout (switching, or in the trainer until its micro-batch
        ends). One a failure took out of its switch never reports: it is forgotten here. One
        sent in this decision is still in its old role in the view (rolling out, or idle
        after a failure) and stays counted: else consolidation, later in the same decision,
        could send it to the trainer again, and reclaim take engines for work it will take."""
        if not self.to_rollout and not self.moving:
            return 0  # (nothing under way, most events: nothing to forget)
        on_way = (Role.SWITCHING, Role.TRAIN)
        failed = set(view.failed_gpus())
        fresh = self.sent_now
        self.to_rollout = {g for g in self.to_rollout
                           if (g in fresh or view.role(g) in on_way) and g not in failed}
        self.moving = {g for g in self.moving
                       if (g in fresh or view.role(g) in on_way) and g not in failed}
        return len(self.to_rollout)
