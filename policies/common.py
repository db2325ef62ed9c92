"""Small helpers shared by the shipped policies (pure functions of the view), and the
shared handling of worker failures (:class:`Retries`, :func:`usable`, :func:`rejoin`)."""

from __future__ import annotations

from operator import itemgetter

from rlsched.cluster.commands import Command, Dispatch, Reassign, SyncWeights
from rlsched.cluster.errors import PolicyError
from rlsched.cluster.ids import EngineId, GpuId, Role, TrajectoryId, TrajStatus
from rlsched.cluster.view import ClusterView, TrainerInfo


def all_gpus(view: ClusterView) -> tuple[int, ...]:
    return tuple(range(view.num_gpus))


def engine_split(view: ClusterView, rollout_fraction: float) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Split the cluster into (rollout GPUs, train GPUs) on engine boundaries.

    At least one engine goes to each side; the rollout share is rounded to whole engines.
    The train side gets at least the trainer's memory floor when the cluster has one (a
    cost-model preset; without one the floor is 1 GPU and this changes nothing), since a
    trainer below it cannot run.
    """
    engines = view.num_gpus // view.tp
    r = min(engines - 1, max(1, round(engines * rollout_fraction)))
    tr = view.trainer()
    floor = tr.min_gpus
    if floor > 1:
        r = max(1, min(r, engines - -(-floor // view.tp)))
        if view.num_gpus - r * view.tp < floor:
            # no fixed split fits: the trainer would sit below its floor for the whole run
            # and the run stall (found on 8 GPUs of the default preset, floor 8)
            need = -(-floor // view.tp) * view.tp + view.tp
            raise PolicyError(
                f"a fixed split of {view.num_gpus} GPUs leaves the trainer {view.num_gpus - r * view.tp}, "
                f"below its memory floor of {floor}{f' ({tr.floor_reason})' if tr.floor_reason else ''}: "
                f"it needs at least {need} GPUs (the floor and one engine of {view.tp}); policies that "
                "move GPUs between the roles (colocated, partial, elastic) run on this cluster")
    cut = r * view.tp
    return tuple(range(cut)), tuple(range(cut, view.num_gpus))


# ------------------------------------------------------------------ worker failures
def usable(view: ClusterView, role: Role) -> tuple[GpuId, ...]:
    """The GPUs a phase change can move to ``role``: working (not failed), not in ``role``
    already, not switching; for ROLLOUT only whole engines, every GPU of which qualifies.

    Without failures this is every GPU not already in ``role`` -- what a policy that moves
    the whole cluster between phases (colocated, partial) asks for."""
    failed = set(view.failed_gpus())
    ok = {
        g for g in range(view.num_gpus)
        if g not in failed and view.role(g) is not role and view.role(g) is not Role.SWITCHING
    }
    if role is Role.ROLLOUT:
        ok = {g for g in ok if all(x in ok for x in view.engine_gpus(view.engine_of(g)))}
    return tuple(sorted(ok))


def rejoin(view: ClusterView, gpu: GpuId, role: Role) -> list[Command]:
    """Put a recovered GPU back to work in ``role``: for TRAIN the GPU alone; for ROLLOUT
    its whole engine, once every GPU of it is idle and working (else nothing yet)."""
    if gpu in view.failed_gpus() or view.role(gpu) is not Role.IDLE:
        return []
    if role is Role.TRAIN:
        return [Reassign((gpu,), Role.TRAIN)]
    if role is not Role.ROLLOUT:
        return []
    failed = set(view.failed_gpus())
    group = view.engine_gpus(view.engine_of(gpu))
    if all(view.role(g) is Role.IDLE and g not in failed for g in group):
        return [Reassign(group, Role.ROLLOUT)]
    return []


def trainer_fills_cluster(view: ClusterView, tr: TrainerInfo) -> bool:
    """A trainer at its memory floor leaves no engine to roll out beside it (the default
    preset's 8-GPU floor on 8 GPUs): GPUs can only move between the roles wholesale, as
    colocated moves them, and no engine can leave rollout to lift a trainer below it."""
    return tr.min_gpus > view.num_gpus - view.tp


def least_loaded_gpus(view: ClusterView, loads: tuple[tuple[EngineId, int], ...], n: int) -> tuple[GpuId, ...]:
    """GPUs of the ``n`` least loaded engines of ``loads`` ((engine, load) in ascending id,
    as ``view.engine_loads()`` gives them), of equal loads the highest ids, in engine order:
    the engines a policy gives up first (a stable sort by load of the engines in descending
    id order, the same order as the key (load, -id))."""
    victims = sorted(reversed(loads), key=itemgetter(1))[:n]
    return tuple(g for e in sorted(e for e, _ in victims) for g in view.engine_gpus(e))


def idle_engines(view: ClusterView) -> tuple[GpuId, ...]:
    """GPUs of engines whose every GPU is idle and working: after a failure (a switch cut
    short, a recovery) they can form an engine again."""
    failed = set(view.failed_gpus())
    idle = set(view.gpus_in(Role.IDLE)) - failed
    out: list[GpuId] = []
    for e in sorted({view.engine_of(g) for g in idle}):
        group = view.engine_gpus(e)
        if all(g in idle for g in group):
            out.extend(group)
    return tuple(out)


def back_to_rollout(view: ClusterView, gpus: tuple[GpuId, ...]) -> tuple[tuple[GpuId, ...], tuple[GpuId, ...]]:
    """Split GPUs leaving the trainer into (whole engines for ROLLOUT, the rest for IDLE).

    An engine is whole when each of its GPUs is one of ``gpus`` or idle and working (a GPU
    back from a failure joins its engine again); without failures every engine is whole."""
    failed = set(view.failed_gpus())
    mine = set(gpus)
    rollout: list[GpuId] = []
    idle: list[GpuId] = []
    for e in sorted({view.engine_of(g) for g in gpus}):
        group = view.engine_gpus(e)
        if all(g in mine or (view.role(g) is Role.IDLE and g not in failed) for g in group):
            rollout.extend(group)
        else:
            idle.extend(g for g in group if g in mine)
    return tuple(rollout), tuple(idle)


def _could_roll_out(view: ClusterView, gpu: GpuId, failed: set[GpuId]) -> bool:
    """Could ``gpu`` have gone to rollout with its engine: is every GPU of the engine
    working and in the trainer or idle (none failed, switching or rolling out)?"""
    return all(x not in failed and view.role(x) in (Role.TRAIN, Role.IDLE)
               for x in view.engine_gpus(view.engine_of(gpu)))


def leave_trainer(view: ClusterView, gpus: tuple[GpuId, ...]) -> tuple[Reassign, ...]:
    """The Reassigns that take the trainer GPUs ``gpus`` out of the trainer -- whole engines
    to ROLLOUT, the rest to IDLE (:func:`back_to_rollout`) -- in an order that leaves the
    trainer, after each, empty, at its memory floor or above, or holding only GPUs that
    could not have gone along. The caller sizes ``gpus`` so that what the trainer keeps
    once all of them are gone is none or at least its floor (then every command is legal
    in turn: tests/test_leave_trainer.py).

    Why an order: a trainer below its memory floor runs nothing, so the contract refuses a
    Reassign that leaves it some GPUs but fewer than its floor -- unless no GPU left behind
    could have gone with that Reassign (a worker failure, not the policy's choice, leaves
    them there). Each command is checked before the next is applied, so when both kinds
    leave, the first must be legal on its own. What stays behind after the first is the
    trainer's GPUs that are not already leaving (sent away while a micro-batch runs: they
    keep role TRAIN until it ends) and not in it:

    * whole engines first, when what stays is none, at least the floor, or cannot roll
      out (each has a GPU of its engine failed, switching or rolling out) -- then the rest
      goes idle;
    * else the rest idle first, when the whole engines (and whatever else stays) are at
      least the floor -- then the whole engines roll out, which empties it;
    * else every one of them idle in one Reassign: the trainer keeps only what it kept
      before, and whole engines roll out again from idle (:func:`idle_engines`).

    (Found under the fingerprint's fault schedule: failures had left the trainer at its
    floor with an engine whose other GPU was leaving -- rolling the whole engines out first
    would leave that GPU alone in the trainer, though it could have gone along.)"""
    rollout, idle = back_to_rollout(view, gpus)
    if not (rollout and idle):
        return tuple(Reassign(g, r) for g, r in ((rollout, Role.ROLLOUT), (idle, Role.IDLE)) if g)
    floor = view.trainer().min_gpus
    failed = set(view.failed_gpus())
    leaving = set(view.leaving_gpus())
    trainer = view.gpus_in(Role.TRAIN)
    gone = leaving.union(rollout)
    stays = [g for g in trainer if g not in gone]
    if (not stays or len(stays) >= floor
            or not any(_could_roll_out(view, g, failed) for g in stays)):
        return Reassign(rollout, Role.ROLLOUT), Reassign(idle, Role.IDLE)
    gone = leaving.union(idle)
    stays = [g for g in trainer if g not in gone]
    if len(stays) >= floor:  # (some stay: the whole engines' GPUs; any of them could go idle)
        return Reassign(idle, Role.IDLE), Reassign(rollout, Role.ROLLOUT)
    mine = set(trainer)
    return (Reassign(tuple(sorted(g for g in rollout + idle if g in mine)), Role.IDLE),)


def phase_is_stuck(view: ClusterView, phase: Role, step: int) -> bool:
    """For policies that move the whole cluster between phases (colocated, partial): a
    recovered GPU waits for the next phase change, unless the current phase holds no GPU
    at all (every engine, or every trainer GPU, failed) or a trainer below its memory floor
    (which runs nothing) -- then it must move now."""
    if phase is Role.ROLLOUT:
        short = not view.engines()
    else:
        tr = view.trainer()
        short = not tr.gpus or len(tr.gpus) < tr.min_gpus
    return short and not view.gpus_in(Role.SWITCHING) and step < view.num_steps


class Retries:
    """Trajectories a worker failure stopped, until they are dispatched again.

    A driver reports each one with ``TrajectoryFinished(status=INTERRUPTED)`` (before the
    ``WorkerFailed``); a policy that did not interrupt it itself hands it to
    :meth:`stopped`, which dispatches it at once to the remaining engines (it resumes from
    its last finished turn) or, with none left, keeps it until :meth:`flush` finds one. A
    policy must not close a step while :attr:`waiting` is non-empty.
    """

    def __init__(self) -> None:
        self.waiting: dict[TrajectoryId, None] = {}

    def clear(self) -> None:
        self.waiting.clear()

    def __bool__(self) -> bool:
        return bool(self.waiting)

    def stopped(self, trajectory: TrajectoryId, view: ClusterView) -> list[Command]:
        self.waiting[trajectory] = None
        return self.flush(view)

    def flush(self, view: ClusterView) -> list[Command]:
        """Dispatch every waiting trajectory if a rollout engine is up."""
        if not self.waiting or not view.engines():
            return []
        tids = tuple(t for t in self.waiting if view.status(t) is TrajStatus.INTERRUPTED)
        self.waiting.clear()
        return [Dispatch(tids)] if tids else []


def refresh_new_engines(view: ClusterView, gpus: tuple[GpuId, ...]) -> list[Command]:
    """A sync for the engines of ``gpus`` (just up in rollout) whose weights are older than
    the trainer's: a driver loads an engine's weights when its switch starts, and an
    optimizer step can end meanwhile. Until it syncs, such an engine may take only work its
    weights may generate (``ClusterState.may_bind``)."""
    version = view.trainer().version
    engines = set(view.engines())  # (each engine once: an engine's GPUs arrive together)
    stale = tuple(sorted(e for e in {view.engine_of(g) for g in gpus}
                         if e in engines and view.engine(e).version < version))
    return [SyncWeights(stale)] if stale else []
