"""The backend protocol: what a driver implements so that :class:`~.driver_loop.DriverLoop`
can execute the policy contract on it.

The loop owns the meaning of every command (legality, record, the state changes the
contract defines, the trainer queue); a backend owns only *how* the work happens and how
long it takes. The simulator (``rlsched.sim.backend``) charges seconds from its cost model
on a SimPy clock; the live driver (``rlsched.real.loop.backend``) submits to vLLM engines,
the Megatron trainer lane and sandboxes on the wall clock. Work that completes later is
reported back through the loop: events through :meth:`DriverLoop.emit
<rlsched.cluster.loop.driver_loop.DriverLoop.emit>`, trainer jobs through
:meth:`TrainerQueue.job_finished <rlsched.cluster.loop.trainer_queue.TrainerQueue.job_finished>`.

Every method is called on the driver's one event-loop thread, after the command passed
``legality.check``; a backend may still refuse what it cannot do in one
:class:`~rlsched.cluster.errors.PolicyError` line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rlsched.cluster.ids import Drain, Role

from .trainer_queue import TrainerBackend


class Backend(TrainerBackend, Protocol):
    """A driver as the loop sees it (the trainer half is :class:`TrainerBackend`)."""

    def dispatch(self, trajectories: Sequence[str], engine: int | None) -> None:
        """Start (or resume) these trajectories, pinned to ``engine`` or, for None, into
        the cluster queue, from which each is admitted on the least-loaded engine on which
        it fits (late binding)."""

    def reassign(self, gpus: Sequence[int], role: Role, drain: Drain) -> None:
        """Move GPUs to ``role``; in-flight trajectories on GPUs leaving rollout are
        drained as ``drain`` says. Ends with ``RolesChanged``."""

    def move(self, trajectories: Sequence[str], engine: int | None) -> None:
        """Migrate queued or running trajectories (their context) to ``engine`` (pinned),
        or for None to the cluster queue's head: the simulator charges a KV transfer or
        a re-prefill, the live driver aborts a generating turn keeping its tokens and
        prefills them again on the engine that admits it."""

    def interrupt(self, trajectory: str, keep_progress: bool) -> None:
        """Stop one trajectory; with ``keep_progress`` its finished turns are kept."""

    def drop(self, trajectories: Sequence[str]) -> None:
        """Driver-side clean-up of dropped trajectories (the loop marks them dropped)."""

    def set_timer(self, at: float, tag: str) -> None:
        """Emit ``TimerFired(tag)`` at time ``at`` (the driver's clock)."""

    def sync(self, engines: tuple[int, ...]) -> None:
        """Send the trainer's current weights to these engines; ends with
        ``WeightsSynced`` (or ``SyncFailed``)."""
