"""Fault injection in the simulator: firing a :class:`~rlsched.cluster.faults.FaultSchedule`
and applying each fault's effect to the run.

Covers: a GPU failing (its engine lost, the trainer shrinking, a role switch cut short),
the trainer crashing, a tool call hanging and a weight sync failing. The rule every effect
keeps is *nothing is lost*: trajectories stop with their finished turns kept and the
policy dispatches them again (:class:`~rlsched.cluster.events.WorkerFailed`); lost
training work is re-queued by the driver; a hung tool call is cut at its limit; a failed
sync is retried. What a fault cost is added up in ``FaultState.stats`` (:mod:`.core`), written
to the run record's ``meta.json`` (``faults``) and read by the analysis.

Faults fire from timers like everything else, so a run with faults is deterministic: the
schedule's own ``random.Random(seed)`` draws rate-fault times and GPU picks, in simulated
time order. A run without a schedule schedules nothing here and takes no other path.
"""

from __future__ import annotations

from rlsched.cluster.errors import ConfigError
from rlsched.cluster.events import (
    RolesChanged,
    ToolTimedOut,
    TrainerFailed,
    WorkerFailed,
    WorkerRecovered,
)
from rlsched.cluster.faults import Fault
from rlsched.cluster.ids import GpuState, Role

from .core import DriverCore
from .engine import EngineSim
from .traj import SimTraj

#: Faults that may fire in a row while no turn and no optimizer step finishes anywhere.
FAULTS_WITHOUT_PROGRESS = 1000


class FaultMixin(DriverCore):
    """Methods of :class:`~rlsched.sim.driver.SimDriver` that inject faults."""

    def _arm_faults(self) -> None:
        """Schedule every fault (called once, after RunStarted has been handled)."""
        sched = self.fault.schedule
        if not sched:
            return
        sched.check_gpus(self.cfg.gpus)
        for f in sched.faults:
            if f.at is not None:
                self._later(f.at - self.now, self._fire_fault, f)
            else:
                self.fault.rate_timers += 1
                self._later(self.fault.rng.expovariate(f.per_hour / 3600.0), self._fire_rate, f)

    def _fire_rate(self, f: Fault, _unused: None) -> None:
        # Only other rate timers pending: nothing else will ever happen (the run is done or
        # stalled), so stop instead of firing faults into an idle cluster forever.
        if len(self._queue) <= self.fault.rate_timers - 1:
            self.fault.rate_timers -= 1
            return
        self._fire_fault(f, None)
        self._later(self.fault.rng.expovariate(f.per_hour / 3600.0), self._fire_rate, f)

    def _fire_fault(self, f: Fault, _unused: None) -> None:
        self._check_outpaced()
        stats = self.fault.stats
        stats["faults"] += 1
        stats[f.kind] += 1
        sched = self.fault.schedule
        if sched is None:  # (never: faults are only armed with a schedule)
            return
        if f.kind == "gpu":
            g = f.gpu
            if g is None:
                up = [x for x in range(self.cfg.gpus) if x not in self.state.failed]
                g = self.fault.rng.choice(up) if up else None
            if g is None or g in self.state.failed:
                self._fault_note("gpu", f"GPU {g} already failed: no effect", gpu=-1 if g is None else g)
                stats["without_effect"] += 1
                return
            self._fail_gpu(g, f.recover_s if f.recover_s is not None else sched.recover_s)
        elif f.kind == "trainer":
            self._fail_trainer()
        elif f.kind == "tool":
            self.fault.hangs.append(f.trajectory)
            who = f.trajectory or "any trajectory"
            self._fault_note("tool", f"next tool call of {who} hangs (cut at {sched.tool_timeout_s:g}s)")
        elif self.fault.sync_fails:  # one armed failure at a time, or retries never end
            stats["without_effect"] += 1
            self._fault_note("sync", "a weight-sync failure is already armed: no effect")
        else:
            self.fault.sync_fails = 1
            self._fault_note("sync", f"next weight sync fails (retried after {sched.sync_retry_s:g}s)")

    def _check_outpaced(self) -> None:
        """End the run with one line when faults come faster than any work gets done.

        A rate high enough that GPUs fail again before a turn can finish would otherwise
        simulate forever: every FAULTS_WITHOUT_PROGRESS faults, the run's progress (optimizer
        steps, turns finished over all trajectories) must have moved."""
        fs = self.fault
        fs.since_mark += 1
        if fs.since_mark < FAULTS_WITHOUT_PROGRESS:
            return
        mark = (self.state.version, sum(ts.turns_done for ts in self.state.trajs.values()))
        if mark == fs.progress_mark:
            raise ConfigError(
                f"[faults]: {FAULTS_WITHOUT_PROGRESS} faults fired by t={self.now:.0f}s without one "
                "turn or step finishing: the fault rate outpaces the cluster; lower per_hour or recover_s"
            )
        fs.progress_mark, fs.since_mark = mark, 0

    def _fault_note(self, kind: str, detail: str, gpu: int = -1) -> None:
        if self.rec is not None:
            self.rec.event(self.now, "Fault", gpu=gpu, detail=f"{kind}: {detail}")

    # ------------------------------------------------------------------ GPU
    def _fail_gpu(self, g: int, recover_s: float) -> None:
        st = self.state
        now = self.now
        role = st.roles[g]
        hit: list[str] = []
        eng = self.engines.get(st.engine_of(g))
        wasted0 = self.fault.stats["wasted_tokens"]
        if eng is not None and g in eng.es.gpus:
            hit = self._kill_engine(eng, g)
            what = f"rollout engine {eng.id} lost, {len(hit)} trajectories interrupted"
        elif role is Role.TRAIN:
            tr = self.trainer
            tr.remove(g)
            if g in self.state.leaving_train:
                gid, _ = self.state.leaving_train.pop(g)
                self._group_drop(gid, g)
            lost = self._abort_step()
            what = f"trainer shrinks to {len(tr.gpus)} GPUs, step re-run ({lost:.1f} GPU-s lost)"
        elif role is Role.SWITCHING:
            gid = self._switch_gid.pop(g, None)
            if gid is not None:
                self._group_drop(gid, g)
            what = "role switch cut short"
        else:
            what = "idle GPU"
        st.roles[g] = Role.IDLE
        st.failed.add(g)
        self.gpus.set((g,), GpuState.FAILED, now)
        self.fault.fail_since[g] = now
        self.fault.fail_token[g] = token = self.fault.fail_token.get(g, 0) + 1
        wasted = int(self.fault.stats["wasted_tokens"] - wasted0)
        self._fault_note("gpu", f"GPU {g} ({role.value}) failed: {what}, {wasted} tokens wasted; "
                                f"back in {recover_s:g}s", gpu=g)
        self._emit(WorkerFailed(g, tuple(hit)))
        self._later(recover_s, self._recover_gpu, g, token)

    def _kill_engine(self, eng: EngineSim, failed: int) -> list[str]:
        """The engine of a failed GPU is gone: stop its trajectories (finished turns kept),
        free its other GPUs (IDLE, or on to the role a drain was taking them to)."""
        st = self.state
        es = eng.es
        eng.closed = True  # first: no admission, no drain-then-switch while emptying it
        es.drain()
        eng.count_out()
        hit = list(es.queue) + sorted(es.running)
        stats = self.fault.stats
        for tid in hit:
            t = self.trajs[tid]
            w0 = t.wasted
            self._interrupt(t, keep=True)
            t.fault_hits += 1
            stats["trajectory_interruptions"] += 1
            stats["wasted_tokens"] += t.wasted - w0
        switch = self._engine_switch.pop(eng.id, None)
        self.gpus.release(eng)
        eng.wake_at = float("inf")
        del self.engines[eng.id]
        st.remove_engine(eng.id)
        if not st.engines():
            self._strand_unbound()  # (no engine left to admit the cluster queue)
        others = tuple(x for x in es.gpus if x != failed)
        if switch is not None:
            gid, role = switch
            self._group_drop(gid, failed)
            if others:
                self._start_switch(others, gid, role)
        elif others:
            for x in others:
                st.roles[x] = Role.IDLE
            self.gpus.set(others, GpuState.IDLE, self.now)
        return hit

    def _group_drop(self, gid: int, g: int) -> None:
        """GPU ``g`` will not finish its switch (it failed): the group reports without it."""
        grp = self._switch_groups.get(gid)
        if grp is None:
            return
        grp[0] -= 1
        grp[1] = tuple(x for x in grp[1] if x != g)
        if grp[0] == 0:
            del self._switch_groups[gid]
            self._emit(RolesChanged(tuple(grp[1]), grp[2]))

    def _recover_gpu(self, g: int, token: int) -> None:
        if self.fault.fail_token.get(g) != token or g not in self.state.failed:
            return
        self.state.failed.discard(g)
        self.fault.stats["failed_gpu_seconds"] += self.now - self.fault.fail_since.pop(g)
        self.gpus.set((g,), GpuState.IDLE, self.now)
        self._emit(WorkerRecovered(g))

    # -------------------------------------------------------------- trainer
    def _fail_trainer(self) -> None:
        tr = self.trainer
        if not tr.gpus:
            self.fault.stats["without_effect"] += 1
            self._fault_note("trainer", "no trainer GPUs: no effect")
            return
        lost = self._abort_step()
        sched = self.fault.schedule
        restart = sched.restart_s if sched else 0.0
        self._fault_note("trainer", f"trainer crashed at version {self.state.version}: step re-run "
                                    f"after a {restart:g}s restart ({lost:.1f} GPU-s lost)")
        self._emit(TrainerFailed(self.state.version, restart))

    def _abort_step(self) -> float:
        """The current step's gradients are gone: re-queue its finished micro-batches and the
        running job (in order, ahead of queued work), then restart the trainer after
        ``restart_s``. Returns the trainer GPU-seconds lost."""
        tr = self.trainer
        now = self.now
        lost = 0.0
        done = [job for job, _, _ in tr.done_jobs]
        lost += sum(secs * n for _, secs, n in tr.done_jobs)
        running_seconds = None
        if self.loop.trainer.running is not None:
            lost += (now - tr.run_started) * len(tr.run_gpus)
            still = tuple(g for g in tr.run_gpus if g in tr.gpus)
            if still:
                self.gpus.set(still, GpuState.TRAIN_IDLE, now)
            tr.run_token += 1  # its completion, still scheduled, is ignored
            running_seconds = tr.run_seconds
        self.loop.trainer.requeue(running_seconds, done)
        tr.done_jobs = []
        self._release_leaving()  # GPUs that waited for the job to end leave now
        sched = self.fault.schedule
        restart = sched.restart_s if sched else 0.0
        lost += restart * len(tr.gpus)
        tr.restart_until = now + restart
        self._later(restart, self._trainer_restarted)
        self.fault.stats["train_gpu_seconds_lost"] += lost
        return lost

    def _trainer_restarted(self, _a: None, _b: None) -> None:
        self.loop.trainer.next()

    # ------------------------------------------------------------ tool hangs
    def _hang(self, t: SimTraj, seconds: float) -> float:
        """An armed tool fault (for ``t``, or for any trajectory) makes this call hang: it
        is cut at the limit, so it lasts ``tool_timeout_s`` (or its recorded time, if that
        is longer: calls are not cut otherwise)."""
        f = self.fault
        for k, target in enumerate(f.hangs):
            if target is None or target == t.tid:
                del f.hangs[k]
                limit = f.schedule.tool_timeout_s if f.schedule else seconds
                cut = max(limit, seconds)
                t.hung = cut
                f.stats["tool_seconds_lost"] += cut - seconds
                if self.rec is not None:
                    self.rec.event(self.now, "Fault", trajectory=t.tid,
                                   detail=f"tool: call hangs, cut at {cut:g}s ({cut - seconds:g}s lost)")
                return cut
        return seconds

    def _tool_cut(self, t: SimTraj) -> None:
        secs, t.hung = t.hung, 0.0
        self._emit(ToolTimedOut(t.tid, secs))

    # ---------------------------------------------------------------- close
    def _close_faults(self) -> dict[str, float]:
        """Totals for the run record (called once, at the end of the run)."""
        stats = self.fault.stats
        for since in self.fault.fail_since.values():
            stats["failed_gpu_seconds"] += self.now - since
        self.fault.fail_since.clear()
        stats["retried_trajectories"] = sum(1 for t in self.trajs.values() if t.fault_hits)
        stats["armed_never_hit"] = len(self.fault.hangs) + self.fault.sync_fails
        return dict(stats)
