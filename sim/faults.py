"""Fault injection in the simulator: firing a :class:`~rlsched.cluster.faults.FaultSchedule`
and applying each fault's effect to the run.

Covers: a GPU failing (its engine lost, the trainer shrinking, a role switch cut short),
the trainer crashing, a tool call hanging and a weight sync failing. The rule every effect
keeps is *nothing is lost*: trajectories stop with their finished turns kept and the
policy dispatches them again (:class:`~rlsched.cluster.events.WorkerFailed`); lost
training work is re-queued by the driver; a hung tool call is cut at its limit; a failed
sync is retried. What a fault cost is added up in ``Faults.stats`` (keys: :data:`STAT_KEYS`), written
to the run record's ``meta.json`` (``faults``) and read by the analysis.

Faults fire from timers like everything else, so a run with faults is deterministic: the
schedule's own ``random.Random(seed)`` draws rate-fault times and GPU picks, in simulated
time order. A run without a schedule schedules nothing here and takes no other path.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from rlsched.cluster.errors import ConfigError
from rlsched.cluster.events import (
    ToolTimedOut,
    TrainerFailed,
    WorkerFailed,
    WorkerRecovered,
)
from rlsched.cluster.faults import Fault, FaultSchedule
from rlsched.cluster.ids import GpuState, Role
from rlsched.cluster.record import ids_text

from .engine import EngineSim
from .traj import SimTraj

if TYPE_CHECKING:
    from .lifecycle import Lifecycle
    from .roles import Roles
    from .training import Training

#: Faults that may fire in a row while no turn and no optimizer step finishes anywhere, once
#: one of them did harm (failed a GPU, crashed a running trainer, failed a sync) or a GPU is
#: still down: then the faults are what stops the run.
FAULTS_WITHOUT_PROGRESS = 1000
#: The same, when none did: a tool call hung past a limit it outlasts anyway, a sync failure
#: armed while one already is, a trainer fault with no trainer cannot stop a run -- one long
#: tool call (hours) outlasts a thousand of them at a high rate. Bounded all the same, or a
#: rate of millions an hour would take long to simulate.
HARMLESS_WITHOUT_PROGRESS = 1_000_000

STAT_KEYS = (
    "faults",  # faults fired (explicit and rate)
    "gpu", "trainer", "tool", "sync",  # of which, per kind
    "without_effect",  # fired but hit nothing (GPU already failed, trainer not running...)
    "trajectory_interruptions",  # trajectories stopped by a fault (one can be hit twice)
    "retried_trajectories",  # distinct trajectories stopped by a fault (set at run end)
    "wasted_tokens",  # generated tokens of turns in progress that faults threw away
    "train_gpu_seconds_lost",  # trainer work re-run + trainer GPUs waiting for a restart
    "sync_gpu_seconds_lost",  # GPU time of weight syncs that failed
    "tool_seconds_lost",  # extra tool-call seconds of hung calls (limit - recorded time)
    "failed_gpu_seconds",  # GPU-seconds GPUs spent failed
    "armed_never_hit",  # tool/sync faults still waiting for a call/sync at run end
)


class Faults:
    """Fires a fault schedule and applies each fault's effect.

    Owns the run's fault state: the ``schedule`` and its ``rng``; ``stats`` (what the
    faults cost, :data:`STAT_KEYS`); the armed effects waiting for their victim,
    ``hangs`` (tool calls: target trajectory, or None for any; read by the per-turn code)
    and ``sync_fails`` (weight syncs); failed GPUs' ``fail_since``/``fail_token``; and the
    rate timers' and the outpacing check's counters. Calls the rollout core (``core``:
    trajectories to stop, engines to close, timers, events), the roles (``roles``: switch
    groups a failed GPU leaves) and the trainer (``training``); marks failed GPUs in the
    store through its driver API (``state.mark_failed``/``mark_recovered``).
    """

    def __init__(self, schedule: FaultSchedule | None, core: Lifecycle, roles: Roles,
                 training: Training) -> None:
        self.core = core
        self.roles = roles
        self.training = training
        self.state = core.state
        self.rec = core.rec
        self.gpus = core.gpus
        self.schedule = schedule
        self.stats: dict[str, float] = dict.fromkeys(STAT_KEYS, 0)
        self.hangs: list[str | None] = []  # armed tool hangs (target trajectory, or None: any)
        self.sync_fails = 0  # armed weight-sync failures
        self.fail_since: dict[int, float] = {}
        self.fail_token: dict[int, int] = {}
        self.rate_timers = 0
        self.progress_mark: tuple[int, int] = (-1, -1)  # (version, turns done) at the last check
        self.since_mark = 0  # faults fired since then
        self.harm = 0  # faults that stopped work so far (GPU, running trainer, sync hit)
        self.harm_mark = 0  # ``harm`` when progress last moved
        self.rng = random.Random(schedule.seed if schedule else 0)

    def arm(self) -> None:
        """Schedule every fault (called once, after RunStarted has been handled)."""
        sched = self.schedule
        if not sched:
            return
        sched.check_gpus(self.core.cfg.gpus)
        for f in sched.faults:
            if f.at is not None:
                self.core.later(f.at - self.core.now, self._fire_fault, f)
            else:
                self.rate_timers += 1
                self.core.later(self.rng.expovariate(f.per_hour / 3600.0), self._fire_rate, f)

    def _fire_rate(self, f: Fault, _unused: None) -> None:
        # Only other rate timers pending: nothing else will ever happen (the run is done or
        # stalled), so stop instead of firing faults into an idle cluster forever.
        if self.core.pending() <= self.rate_timers - 1:
            self.rate_timers -= 1
            return
        self._fire_fault(f, None)
        self.core.later(self.rng.expovariate(f.per_hour / 3600.0), self._fire_rate, f)

    def _fire_fault(self, f: Fault, _unused: None) -> None:
        self._check_outpaced()
        stats = self.stats
        stats["faults"] += 1
        stats[f.kind] += 1
        sched = self.schedule
        if sched is None:  # (never: faults are only armed with a schedule)
            return
        if f.kind == "gpu":
            g = f.gpu
            if g is None:
                up = [x for x in range(self.core.cfg.gpus) if x not in self.state.failed]
                g = self.rng.choice(up) if up else None
            if g is None or g in self.state.failed:
                self._fault_note("gpu", f"GPU {g} already failed: no effect", gpu=-1 if g is None else g)
                stats["without_effect"] += 1
                return
            self._fail_gpu(g, f.recover_s if f.recover_s is not None else sched.recover_s)
        elif f.kind == "trainer":
            self._fail_trainer()
        elif f.kind == "tool":
            self.hangs.append(f.trajectory)
            who = f.trajectory or "any trajectory"
            self._fault_note("tool", f"next tool call of {who} hangs (cut at {sched.tool_timeout_s:g}s)")
        elif self.sync_fails:  # one armed failure at a time, or retries never end
            stats["without_effect"] += 1
            self._fault_note("sync", "a weight-sync failure is already armed: no effect")
        else:
            self.sync_fails = 1
            self._fault_note("sync", f"next weight sync fails (retried after {sched.sync_retry_s:g}s)")

    def _check_outpaced(self) -> None:
        """End the run with one line when faults come faster than any work gets done.

        A rate high enough that GPUs fail again before a turn can finish would otherwise
        simulate forever: every FAULTS_WITHOUT_PROGRESS faults, the run's progress (optimizer
        steps, turns finished over all trajectories) must have moved -- unless no fault since
        it last moved did harm and no GPU is down (then the run is only waiting, e.g. for a
        long tool call): those get HARMLESS_WITHOUT_PROGRESS."""
        fs = self
        fs.since_mark += 1
        if fs.since_mark % FAULTS_WITHOUT_PROGRESS:
            return
        mark = (self.state.version, sum(ts.turns_done for ts in self.state.trajs.values()))
        if mark != fs.progress_mark:
            fs.progress_mark, fs.since_mark, fs.harm_mark = mark, 0, fs.harm
            return
        if fs.harm != fs.harm_mark or self.state.failed or fs.since_mark >= HARMLESS_WITHOUT_PROGRESS:
            raise ConfigError(
                f"[faults]: {fs.since_mark} faults fired by t={self.core.now:.0f}s without one "
                "turn or step finishing: the fault rate outpaces the cluster; lower per_hour, or "
                "recover_s (GPU faults) or restart_s (trainer faults)"
            )

    def _fault_note(self, kind: str, detail: str, gpu: int = -1) -> None:
        if self.rec is not None:
            self.rec.event(self.core.now, "Fault", gpu=gpu, detail=f"{kind}: {detail}")

    # ------------------------------------------------------------------ GPU
    def _fail_gpu(self, g: int, recover_s: float) -> None:
        self.harm += 1
        st = self.state
        now = self.core.now
        role = st.roles[g]
        hit: list[str] = []
        eng = self.core.engines.get(st.engine_of(g))
        wasted0 = self.stats["wasted_tokens"]
        if eng is not None and g in eng.es.gpus:
            hit = self._kill_engine(eng, g)
            what = f"rollout engine {eng.id} lost, {len(hit)} trajectories interrupted"
        elif role is Role.TRAIN:
            tr = self.training.trainer
            tr.remove(g)
            self.roles.cut_leaving(g)
            lost = self._abort_step()
            what = f"trainer shrinks to {len(tr.gpus)} GPUs, step re-run ({lost:.1f} GPU-s lost)"
        elif role is Role.SWITCHING:
            self.roles.cut_switch(g)
            what = "role switch cut short"
        else:
            what = "idle GPU"
        st.mark_failed(g)
        self.gpus.set((g,), GpuState.FAILED, now)
        self.fail_since[g] = now
        self.fail_token[g] = token = self.fail_token.get(g, 0) + 1
        wasted = int(self.stats["wasted_tokens"] - wasted0)
        self._fault_note("gpu", f"GPU {g} ({role.value}) failed: {what}, {wasted} tokens wasted; "
                                f"back in {recover_s:g}s", gpu=g)
        self.core.emit(WorkerFailed(g, tuple(hit)))
        self.core.later(recover_s, self._recover_gpu, g, token)

    def _kill_engine(self, eng: EngineSim, failed: int) -> list[str]:
        """The engine of a failed GPU is gone: stop its trajectories (finished turns kept),
        free its other GPUs (IDLE, or on to the role a drain was taking them to)."""
        st = self.state
        es = eng.es
        eng.closed = True  # first: no admission, no drain-then-switch while emptying it
        es.drain()
        eng.count_out()
        hit = list(es.queue) + sorted(es.running)
        stats = self.stats
        for tid in hit:
            t = self.core.trajs[tid]
            w0 = t.wasted
            self.core.interrupt(tid, keep=True)
            t.fault_hits += 1
            stats["trajectory_interruptions"] += 1
            stats["wasted_tokens"] += t.wasted - w0
        switch = self.roles.take_switch(eng.id)
        self.core.close_engine(eng)
        if not st.engines():
            self.core.strand_unbound()  # (no engine left to admit the cluster queue)
        others = tuple(x for x in es.gpus if x != failed)
        if switch is not None:
            gid, role = switch
            self.roles.group_drop(gid, failed)
            if others:
                self.roles.start_switch(others, gid, role)
        elif others:
            st.set_roles(others, Role.IDLE)
            self.gpus.set(others, GpuState.IDLE, self.core.now)
        return hit

    def _recover_gpu(self, g: int, token: int) -> None:
        if self.fail_token.get(g) != token or g not in self.state.failed:
            return
        self.state.mark_recovered(g)
        self.stats["failed_gpu_seconds"] += self.core.now - self.fail_since.pop(g)
        self.gpus.set((g,), GpuState.IDLE, self.core.now)
        self.core.emit(WorkerRecovered(g))

    # -------------------------------------------------------------- trainer
    def _fail_trainer(self) -> None:
        tr = self.training.trainer
        if not tr.gpus:
            self.stats["without_effect"] += 1
            self._fault_note("trainer", "no trainer GPUs: no effect")
            return
        self.harm += 1
        lost = self._abort_step()
        sched = self.schedule
        restart = sched.restart_s if sched else 0.0
        self._fault_note("trainer", f"trainer crashed at version {self.state.version}: step re-run "
                                    f"after a {restart:g}s restart ({lost:.1f} GPU-s lost)")
        self.core.emit(TrainerFailed(self.state.version, restart))

    def _abort_step(self) -> float:
        """The current step's gradients are gone: the trainer re-queues its work
        (:meth:`Training.abort_job`), GPUs that waited for the job to end leave now, and
        the trainer restarts after ``restart_s``. Returns the trainer GPU-seconds lost."""
        lost = self.training.abort_job()
        self.roles.release_leaving()
        sched = self.schedule
        lost += self.training.restart(sched.restart_s if sched else 0.0)
        self.stats["train_gpu_seconds_lost"] += lost
        return lost

    # ------------------------------------------------------------ weight sync
    def sync_failed(self, live: tuple[int, ...], version: int, lost: float) -> float:
        """The armed sync failure hit the sync of ``version`` to engines ``live`` (the
        trainer undoes it, :meth:`Training._sync_failed`): count and record it; returns
        the seconds after which the sync is retried."""
        self.sync_fails -= 1
        self.harm += 1
        retry = self.schedule.sync_retry_s if self.schedule else 0.0
        self.stats["sync_gpu_seconds_lost"] += lost
        if self.rec is not None:
            self.rec.event(self.core.now, "Fault", version=version,
                           detail=f"sync: weight sync of version {version} to engines {ids_text(live)} "
                                  f"failed ({lost:.1f} GPU-s lost); retry in {retry:g}s")
        return retry

    # ------------------------------------------------------------ tool hangs
    def hang(self, t: SimTraj, seconds: float) -> float:
        """An armed tool fault (for ``t``, or for any trajectory) makes this call hang: it
        is cut at the limit, so it lasts ``tool_timeout_s`` (or its recorded time, if that
        is longer: calls are not cut otherwise)."""
        f = self
        for k, target in enumerate(f.hangs):
            if target is None or target == t.tid:
                del f.hangs[k]
                limit = f.schedule.tool_timeout_s if f.schedule else seconds
                cut = max(limit, seconds)
                t.hung = cut
                f.stats["tool_seconds_lost"] += cut - seconds
                if self.rec is not None:
                    self.rec.event(self.core.now, "Fault", trajectory=t.tid,
                                   detail=f"tool: call hangs, cut at {cut:g}s ({cut - seconds:g}s lost)")
                return cut
        return seconds

    def tool_cut(self, t: SimTraj) -> None:
        """A hung tool call of ``t`` was cut at its limit: the policy hears of it."""
        secs, t.hung = t.hung, 0.0
        self.core.emit(ToolTimedOut(t.tid, secs))

    # ---------------------------------------------------------------- close
    def close(self) -> dict[str, float]:
        """Totals for the run record (called once, at the end of the run)."""
        stats = self.stats
        for since in self.fail_since.values():
            stats["failed_gpu_seconds"] += self.core.now - since
        self.fail_since.clear()
        stats["retried_trajectories"] = sum(1 for t in self.core.trajs.values() if t.fault_hits)
        stats["armed_never_hit"] = len(self.hangs) + self.sync_fails
        return dict(stats)
