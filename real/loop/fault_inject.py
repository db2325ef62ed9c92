"""What each ``[faults]`` fault does to a running live cluster (the schedule: ``loop.faults``).

Why a module of its own: the fault paths touch rollout (a killed engine), training (a failed
weight sync) and the tools (a hung call); keeping them here leaves the driver's loop and its
trainer queue free of fault bookkeeping. Each effect keeps the simulator's rule --
*nothing is lost*: interrupted trajectories keep their finished turns and the policy
dispatches them again (``WorkerFailed``), a failed sync leaves the engines generating on
the weights they had and is retried. The records (``Fault`` rows, ``WorkerFailed``,
``WorkerRecovered``, ``SyncFailed``) are the simulator's (``sim/faults.py``,
``sim/training.py``); where the live figure differs in kind (tokens an engine generated in
the turn it died in are never reported back), the detail says so.

Everything here runs on the driver's event-loop thread (``loop/driver.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlsched.cluster.events import SyncFailed, TrainerFailed, WorkerFailed, WorkerRecovered
from rlsched.cluster.faults import Fault
from rlsched.cluster.ids import GpuState, Role
from rlsched.cluster.record import ids_text
from rlsched.real.rollout.engine import SyncRefused

if TYPE_CHECKING:
    from rlsched.real.loop.driver import LiveDriver


def fire_due(h: LiveDriver) -> None:
    """Fire every fault whose time has come (called from the loop's timer check)."""
    fs = h.faults
    if fs is None:
        return
    if fs.switching:  # gpu faults that found their GPU switching: fail it once it arrived
        waiting, fs.switching = fs.switching, []
        for f, g in waiting:
            _fail_gpu(h, f, g)
    for f in fs.due(h.now()):
        if f.kind == "gpu":
            _fail_gpu(h, f, f.gpu)
        elif f.kind == "trainer":
            _fail_trainer(h)
        else:
            h.rec.event(h.now(), "Fault", detail=fs.arm(f))


def note(h: LiveDriver, kind: str, detail: str, gpu: int = -1, **kw: Any) -> None:
    h.rec.event(h.now(), "Fault", gpu=gpu, detail=f"{kind}: {detail}", **kw)


def later(h: LiveDriver, seconds: float, fn: Callable[[], None]) -> None:
    """Call ``fn`` on the loop thread after ``seconds`` (counted in flight, so the loop
    never takes the run for stalled while a recovery or a retry is pending)."""
    h.bg(lambda: h._stopping.wait(seconds), cb=lambda _: fn())


# ----------------------------------------------------------------------- sync
def sync_should_fail(h: LiveDriver) -> bool:
    """Take the armed sync failure for the sync starting now, if there is one."""
    return h.faults is not None and h.faults.take_sync_failure()


def failing_sync(h: LiveDriver, live: list[int], pub: Any, target: int, t0: float) -> None:
    """Send ``live`` engines the weights with the armed failure: each receives them and
    refuses to load them (``engine.SyncRefused``); once all have answered, the sync failed."""
    left = {"n": len(live)}

    def one(value: Any, e: int) -> None:
        left["n"] -= 1
        exc = getattr(value, "exc", None)
        if exc is not None and not _refused(exc):
            h.roles.engine_failed(e, exc)  # a real failure besides the injected one
        if left["n"] == 0:
            sync_failed(h, [x for x in live if x in h.rollout.engines], target, h.now() - t0)

    for e in live:
        eng = h.rollout.engines[e]
        ref = eng.actor.update_weights.remote(pub.ref, target, True)
        h.submit(outcome(ref.future()), lambda v, e=e: one(v, e))


def _refused(exc: BaseException) -> bool:
    return isinstance(exc, SyncRefused) or isinstance(getattr(exc, "cause", None), SyncRefused)


def sync_failed(h: LiveDriver, live: list[int], version: int, seconds: float) -> None:
    """As ``sim/training._sync_failed``: the engines keep their weights and go on
    generating; ``SyncFailed``; the same engines are synced again after ``sync_retry_s``."""
    fs = h.faults
    assert fs is not None
    retry = fs.schedule.sync_retry_s
    for e in live:
        h.rollout.engines[e].syncing = False
        h.st.engines_[e].syncing = False
        h.rollout.touch(e)
        h.rollout.kick(e)
    lost = seconds * h.st.tp * len(live)  # measured: the engines stalled this long for nothing
    fs.stats["sync_gpu_seconds_lost"] += lost
    note(h, "sync", f"weight sync of version {version} to engines {ids_text(live)} failed "
                    f"({lost:.1f} GPU-s lost); retry in {retry:g}s", version=version)
    h.emit(SyncFailed(tuple(live), version, retry))
    later(h, retry, lambda: h.training.sync(tuple(e for e in live if e in h.rollout.engines)))


# ------------------------------------------------------------------------ gpu
def _fail_gpu(h: LiveDriver, f: Fault, g: int | None) -> None:
    fs, st = h.faults, h.st
    assert fs is not None
    if g is None:
        up = [x for x in range(st.num_gpus) if x not in st.failed]
        g = fs.rng.choice(up) if up else None
    if g is None or g in st.failed:
        fs.stats["without_effect"] += 1
        note(h, "gpu", f"GPU {g} already failed: no effect", gpu=-1 if g is None else g)
        return
    recover_s = f.recover_s if f.recover_s is not None else fs.schedule.recover_s
    role = st.roles[g]
    if (role is Role.SWITCHING or (role is Role.ROLLOUT and st.engine_of(g) not in h.rollout.engines)
            or (role is Role.TRAIN and h.roles.lane_ops)):
        # A switch in flight (an engine booting, a trainer resizing) cannot be cut short for
        # real yet: the GPU fails the moment it arrives in its new role (or the resize ends).
        fs.switching.append((f, g))
        return
    e = st.engine_of(g) if role is Role.ROLLOUT else None
    hit: tuple[str, ...] = ()
    if e is not None and e in h.rollout.engines:
        import ray

        ray.kill(h.rollout.engines[e].actor)  # for real: the process holding the GPU is gone
        hit = h.roles.engine_failed(e, f"killed by a [faults] gpu fault on GPU {g}", failed=g)
        what = (f"rollout engine {e} lost, {len(hit)} trajectories interrupted "
                "(the tokens of their turns in progress died with it)")
    elif role is Role.TRAIN:
        what = _fail_trainer_gpu(h, g)
    else:
        what = "idle GPU"
    fs.stats["trajectory_interruptions"] += len(hit)
    fs.hit.update(hit)
    now = h.now()
    st.mark_failed(g)
    h.timeline.set((g,), GpuState.FAILED, now)
    fs.fail_since[g] = now
    fs.fail_token[g] = token = fs.fail_token.get(g, 0) + 1
    note(h, "gpu", f"GPU {g} ({role.value}) failed: {what}; back in {recover_s:g}s", gpu=g)
    h.emit(WorkerFailed(g, hit))
    later(h, recover_s, lambda: _recover_gpu(h, g, token))


def _recover_gpu(h: LiveDriver, g: int, token: int) -> None:
    fs, st = h.faults, h.st
    assert fs is not None
    if fs.fail_token.get(g) != token or g not in st.failed:
        return
    st.mark_recovered(g)
    fs.stats["failed_gpu_seconds"] += h.now() - fs.fail_since.pop(g)
    h.timeline.set((g,), GpuState.IDLE, h.now())
    h.emit(WorkerRecovered(g))


# -------------------------------------------------------------------- trainer
def _fail_trainer(h: LiveDriver) -> None:
    fs, st = h.faults, h.st
    assert fs is not None
    if not st.gpus_in(Role.TRAIN) and not h.roles.lane_ops:
        fs.stats["without_effect"] += 1
        note(h, "trainer", "no trainer GPUs: no effect")
        return
    fs.trainer_armed += 1
    if h.training.job_running and not h.roles.lane_ops:
        trainer_job_started(h)  # a job is running: it crashes now


def trainer_job_started(h: LiveDriver) -> None:
    """A training job was just handed to the trainer: an armed trainer fault crashes it."""
    fs = h.faults
    if fs is None or not fs.trainer_armed or h.lane.group is None:
        return
    fs.trainer_armed -= 1
    st = h.st
    gpus = st.gpus_in(Role.TRAIN)
    ranks = h.lane.crash()  # for real: the ranks' processes are killed, the job fails on them
    lost = h.training.abort_step()
    restart = fs.schedule.restart_s
    lost += restart * len(gpus)
    fs.stats["train_gpu_seconds_lost"] += lost
    note(h, "trainer", f"trainer crashed at version {st.version}: step re-run after a {restart:g}s restart "
                       f"({lost:.1f} GPU-s lost; {ranks} ranks killed)", version=st.version)
    h.emit(TrainerFailed(st.version, restart))
    _restart_trainer(h, None)


def _restart_trainer(h: LiveDriver, slots: list[int] | None) -> None:
    """After a crash: the lane restarts the trainer (on ``slots``; None: the same ones)
    after ``restart_s``; no job and no membership change runs before that."""
    fs = h.faults
    assert fs is not None
    h.roles.lane_op(h.lane.restart(fs.schedule.restart_s, h.base + h.st.version, h._stopping, slots))
    h.roles.release_leaving()  # GPUs that waited for the job to end leave now (after the restart)


def _fail_trainer_gpu(h: LiveDriver, g: int) -> str:
    """A trainer GPU fails (as ``sim/faults._fail_gpu``'s trainer branch): the step's
    gradients are gone (its micro-batches are re-run), and the trainer goes on without the
    GPU -- live, its ranks are killed and it restarts on the other slots after
    ``restart_s`` from the last step's checkpoint (none left: when GPUs come back)."""
    fs, roles = h.faults, h.roles
    assert fs is not None
    leaving = h.st.cancel_leaving(g)
    if leaving is not None:
        roles._group_drop(leaving[0], g)
        roles.partner_lost(g)  # (GPUs of its engine that went ahead to rollout wait no more)
    roles.trainer_slots = [s for s in roles.trainer_slots if s != g]
    h.lane.crash()
    lost = h.training.abort_step()
    lost += fs.schedule.restart_s * len(roles.trainer_slots)
    fs.stats["train_gpu_seconds_lost"] += lost
    _restart_trainer(h, list(roles.trainer_slots))
    return f"trainer shrinks to {len(roles.trainer_slots)} GPUs, step re-run ({lost:.1f} GPU-s lost)"


# ---------------------------------------------------------------------- helpers
def raise_failure(exc: BaseException) -> None:
    """Raise a worker's exception on the loop thread as the loop would (one line)."""
    from rlsched.cluster.errors import RlschedError

    if isinstance(exc, RlschedError):
        raise exc
    cause = getattr(exc, "cause", None)
    if isinstance(cause, RlschedError):
        raise type(cause)(str(cause).splitlines()[0]) from None
    raise exc


class Failed:
    """A call's exception as a value (so a failure reaches its callback, not the loop)."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def outcome(fut: Any) -> Any:
    """A future resolving to ``fut``'s result, or to :class:`Failed` with its exception."""
    from concurrent.futures import Future

    out: Future = Future()

    def done(f: Any) -> None:
        try:
            out.set_result(f.result())
        except Exception as exc:
            out.set_result(Failed(exc))

    fut.add_done_callback(done)
    return out
