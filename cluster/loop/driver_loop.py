"""The driver loop: the policy contract's meaning, written once for both drivers.

Events wait in one FIFO (:meth:`DriverLoop.emit`). :meth:`DriverLoop.pump` hands them to
the policy one at a time, in order; each command the policy answers is checked
(``legality.check``, with the policy's ``defers``: a policy that does not defer trains step
s's batch at version s), recorded (:mod:`.recording`) and applied before the next event:
trainer commands go to the :class:`~.trainer_queue.TrainerQueue`, everything else to the
:class:`~.backend.Backend`, except the state change ``Drop`` itself defines (marking the
trajectories dropped), which is made here after the backend's clean-up.

The policy sees the state through ``self.view``: the store itself, or -- with
``guard_view`` (the simulator's ``--check``, and every live run) -- the store behind
:class:`~rlsched.cluster.view.ReadOnlyView`, so a policy that writes, or reads past the
:class:`~rlsched.cluster.view.ClusterView` contract, fails at once, naming the attribute.
The guard costs a Python call per read, which is why plain simulated runs go without it.

The pump is re-entrant-safe: an event emitted while commands are applied waits in the
FIFO and is delivered by the pump already running, after the current event's commands.

A policy answers an event with all its commands at once, from the view as it was; applying
one may finish a trajectory a later one names (a Move that frees an engine's KV admits the
head of its queue, whose next turn outgrows any engine: it times out at once). Such a
trajectory -- done or timed out *while this decision's commands were applied* -- is left out
of a later Move or Interrupt of the same decision (:func:`overtaken`) instead of failing the
run; one that had finished before the policy decided is still the policy's error.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import replace
from random import Random

from rlsched.cluster.commands import (
    Command,
    Dispatch,
    Drop,
    Interrupt,
    Move,
    OptimizerStep,
    Reassign,
    SetTimer,
    SyncWeights,
    Train,
    TrainMicroBatch,
)
from rlsched.cluster.errors import PolicyError
from rlsched.cluster.events import Event, TrainStepFinished
from rlsched.cluster.ids import TrajStatus
from rlsched.cluster.legality import check
from rlsched.cluster.policy import Policy
from rlsched.cluster.state import ClusterState
from rlsched.cluster.view import ClusterView, ReadOnlyView

from .backend import Backend
from .recording import EventSink, record_command, record_event
from .trainer_queue import TrainerQueue

_COMPLETED = (TrajStatus.DONE, TrajStatus.TIMED_OUT)


class DriverLoop:
    """One run's event FIFO, policy pump, command dispatch and trainer queue."""

    def __init__(self, state: ClusterState, policy: Policy, backend: Backend, recorder: EventSink | None, *,
                 version_base: int = 0, progress: Callable[[int, int, float], None] | None = None,
                 before_event: Callable[[], None] | None = None,
                 step_recorded: Callable[[], None] | None = None, guard_view: bool = False) -> None:
        """``recorder`` None records nothing. ``before_event`` runs before each event is
        delivered (the simulator's ``--check`` invariants); ``step_recorded`` runs once a
        ``TrainStepFinished`` is recorded, before the policy reacts to it (the live driver
        makes the step durable there). ``guard_view``: hand the policy a
        :class:`~rlsched.cluster.view.ReadOnlyView` (see the module docstring).
        ``version_base`` and ``progress``: see :class:`~.trainer_queue.TrainerQueue`."""
        self.state = state
        self.view: ClusterView = ReadOnlyView(state) if guard_view else state  # type: ignore[assignment]
        self.policy = policy
        self.backend = backend
        self.rec = recorder
        self.events: deque[Event] = deque()
        self.emit: Callable[[Event], None] = self.events.append
        self.trainer = TrainerQueue(state, backend, self.emit, version_base=version_base, progress=progress)
        self.before_event = before_event
        self.step_recorded = step_recorded
        self.pumped = 0  # events delivered to the policy
        self._pumping = False
        # the policy's declaration, read once per run: without it, a Train of a trajectory
        # outside the trainer's current step is refused (see legality.check)
        self.defers = bool(policy.defers)

    def reset_policy(self, rng: Random) -> None:
        """Start the policy on this run's view (before the first event)."""
        self.policy.reset(self.view, rng)
        self.defers = bool(self.policy.defers)

    def pump(self) -> None:
        """Deliver every waiting event (and those its commands cause) to the policy."""
        if self._pumping:
            return
        self._pumping = True
        try:
            st = self.state
            now = self.backend.now
            st.advance(now())
            policy, apply, rec, view = self.policy, self.apply, self.rec, self.view
            before, step_recorded, defers = self.before_event, self.step_recorded, self.defers
            events = self.events
            while events:
                ev = events.popleft()
                self.pumped += 1
                if before is not None:
                    before()
                if rec is not None:
                    record_event(rec, now(), ev, st)
                if step_recorded is not None and type(ev) is TrainStepFinished:
                    step_recorded()
                seq = st.finish_seq
                for cmd in policy.on_event(ev, view):
                    if st.finish_seq != seq and type(cmd) in (Move, Interrupt):
                        cmd = overtaken(st, cmd, seq)
                        if cmd is None:
                            continue
                    check(st, cmd, defers=defers)
                    if rec is not None:
                        record_command(rec, now(), cmd, st)
                    apply(cmd)
        finally:
            self._pumping = False

    def apply(self, cmd: Command) -> None:
        """Execute one checked command (see the module docstring for who does what)."""
        b = self.backend
        tq = self.trainer
        match cmd:
            case Dispatch(trajectories=tids, engine=e):
                b.dispatch(tids, e)
            case Reassign(gpus=gpus, role=role, drain=drain):
                b.reassign(gpus, role, drain)
            case TrainMicroBatch(trajectories=tids):
                tq.micro_batch(tids)
                tq.next()
            case Train(trajectories=tids):
                tq.micro_batch(tids)
                tq.optimizer_step()
                tq.next()
            case OptimizerStep():
                tq.optimizer_step()
                tq.next()
            case SyncWeights(engines=es):
                b.sync(tuple(es) if es is not None else self.state.engines())
            case Interrupt(trajectories=tids, keep_progress=keep):
                for tid in tids:
                    b.interrupt(tid, keep)
            case Move(trajectories=tids, engine=e):
                b.move(tids, e)
            case Drop(trajectories=tids):
                b.drop(tids)
                self.state.mark_dropped(tids)
            case SetTimer(at=at, tag=tag):
                b.set_timer(at, tag)
            case _:
                raise PolicyError(f"unknown command {cmd!r}: expected one of rlsched.cluster.commands")


def overtaken(st: ClusterState, cmd: Move | Interrupt, seq: int) -> Move | Interrupt | None:
    """``cmd`` without the trajectories that finished done or timed out after ``seq`` (the
    state's ``finish_seq`` when the policy decided): earlier commands of the same decision
    finished them (see the module docstring). None if that leaves nothing."""
    trajs = st.trajs
    keep = tuple(t for t in cmd.trajectories
                 if not (trajs[t].finished_seq > seq and trajs[t].status in _COMPLETED))
    if len(keep) == len(cmd.trajectories):
        return cmd
    return replace(cmd, trajectories=keep) if keep else None
