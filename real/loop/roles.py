"""Role changes on the live cluster: ``Reassign`` executed on real workers.

A GPU leaving rollout takes its whole engine with it: the engine is drained (its
trajectories migrate, finish their turn, or stop keeping their progress, per the drain
mode), then its actor is killed, which frees the slot's Ray resource; only then can a
trainer rank (or a new engine) start on that slot. A GPU leaving training waits for the
trainer's running job, then the trainer's data-parallel group is resized without it. The
GPUs of one ``Reassign`` report a single ``RolesChanged`` once the last of them arrived.

Everything here runs on the driver's event-loop thread (see ``loop/driver.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlsched.cluster.events import RolesChanged, WorkerFailed, WorkerRecovered
from rlsched.cluster.ids import Drain, GpuState, Role, TrajStatus
from rlsched.cluster.loop.assembly import Assembly, Part
from rlsched.cluster.record import ids_text
from rlsched.cluster.state import EngineState
from rlsched.real.loop.ray_cluster import slots_options, wait_ready
from rlsched.real.loop.rollout import EngineHandle

if TYPE_CHECKING:
    from rlsched.real.loop.driver import LiveDriver


class Roles:
    def __init__(self, host: LiveDriver) -> None:
        self.h = host
        self._groups: dict[int, list] = {}  # Reassign id -> [GPUs still to arrive, gpus, role, t0]
        self._engine_switch: dict[int, tuple[int, Role]] = {}
        self._target: dict[int, Role] = {}  # GPU switching -> the role it switches to
        self._assembly = Assembly()  # GPUs landed in rollout, waiting for their engine's rest
        self.trainer_slots: list[int] = []
        self.lane_ops = 0  # trainer membership changes in flight
        self._seq = 0

    def reassign(self, gpus: tuple[int, ...], role: Role, drain: Drain) -> None:
        self._seq += 1
        gid = self._seq
        self._groups[gid] = [len(gpus), gpus, role, self.h.now()]
        st = self.h.st
        by_engine: dict[int, list[int]] = {}
        direct: list[int] = []
        for g in gpus:
            if st.roles[g] is Role.ROLLOUT:
                by_engine.setdefault(st.engine_of(g), []).append(g)
            elif st.roles[g] is Role.TRAIN and self.h.training.job_running:
                st.leave_train_later(g, gid, role)
            else:
                direct.append(g)
        if direct:
            self.start_switch(tuple(direct), gid, role)
        for e in sorted(by_engine):
            self._drain_engine(e, gid, role, drain)

    def release_leaving(self) -> None:
        """The trainer's job ended: GPUs asked to leave training go now."""
        leaving = self.h.st.take_leaving()
        by_group: dict[tuple[int, Role], list[int]] = {}
        for g, key in sorted(leaving.items()):
            by_group.setdefault(key, []).append(g)
        for (gid, role), gs in by_group.items():
            self.start_switch(tuple(gs), gid, role)

    # ------------------------------------------------------------ engines out
    def _drain_engine(self, e: int, gid: int, role: Role, drain: Drain) -> None:
        h = self.h
        es = h.st.engines_[e]
        es.drain()
        self._engine_switch[e] = (gid, role)
        others = [x for x in h.st.engines_.values() if not x.draining]
        if drain is not Drain.INTERRUPT and not others and (es.running or es.queue):
            drain = Drain.INTERRUPT  # nowhere to migrate to: keep progress, stop here
        rollout = h.rollout
        if not others:
            rollout.strand_unbound()
        for tid in list(es.queue) + sorted(es.running):
            if drain is Drain.INTERRUPT:
                rollout.interrupt(tid, keep=True)
            elif (drain is Drain.MIGRATE or tid in es.queue or rollout.rt[tid].in_env
                  or tid not in rollout.engines[e].gen):
                rollout.move_out(tid, e)
        self.maybe_close_engine(e)

    def maybe_close_engine(self, e: int) -> None:
        h = self.h
        es = h.st.engines_.get(e)
        if es is None or not es.draining or es.running or es.queue or not h.rollout.idle(e):
            return
        gid, role = self._engine_switch.pop(e)
        eng = h.rollout.engines.pop(e)
        h.st.remove_engine(e)
        import ray

        ray.kill(eng.actor)  # frees the engine's slot resources for the next role
        h.rec.event(h.now(), "EngineStop", engine=e, detail=f"{eng.tokens} tokens")
        self.start_switch(es.gpus, gid, role)

    # ---------------------------------------------------------------- switches
    def start_switch(self, gpus: tuple[int, ...], gid: int, role: Role) -> None:
        h = self.h
        st, now = h.st, h.now()
        leaving_train = [g for g in gpus if st.roles[g] is Role.TRAIN]
        st.set_roles(gpus, Role.SWITCHING)
        self._target.update(dict.fromkeys(gpus, role))
        h.timeline.set(gpus, GpuState.SWITCH, now)
        h.rec.event(now, "SwitchStart", detail=f"{role.value} {ids_text(gpus)}")
        t0 = time.perf_counter()

        def arrive(_: Any = None) -> None:
            if role is Role.ROLLOUT:
                self._land_rollout(gpus, gid, t0)
            elif role is Role.TRAIN:
                self.trainer_slots = sorted({*self.trainer_slots, *gpus})
                self._lane_op(self.trainer_slots, lambda r: self._end_switch(gpus, gid, role, t0))
            else:
                self._end_switch(gpus, gid, role, t0)

        if leaving_train:
            self.trainer_slots = [s for s in self.trainer_slots if s not in leaving_train]
            self._lane_op(self.trainer_slots, arrive)
        else:
            arrive()

    def _lane_op(self, slots: list[int], cb: Callable[[Any], None]) -> None:
        self.lane_op(self.h.lane.set_slots(slots), cb)

    def lane_op(self, fut: Any, cb: Callable[[Any], None] | None = None) -> None:
        """Run one trainer membership change (a resize, or a restart after a crash): no
        job and no other change runs until it reports; then the next job may start."""
        h = self.h
        self.lane_ops += 1

        def done(r: dict) -> None:
            self.lane_ops -= 1
            h.stats["trainer"].append(r)
            h.rec.event(h.now(), "TrainerResize", detail=f"{r['action']} world={r['world']} {r['seconds']:.2f}s")
            if cb is not None:
                cb(r)
            h.training.next_job()

        h.submit(fut, done)

    def _land_rollout(self, gpus: tuple[int, ...], gid: int, t0: float) -> None:
        """GPUs are free for rollout: an engine boots once every GPU of it is
        (:mod:`rlsched.cluster.loop.assembly`); until then these wait, SWITCHING. (Booted on
        the first, an engine's actor claimed its partner's slot while the partner still
        trained, and the partner's own arrival booted a second actor for the same engine.)"""
        st = self.h.st
        for f in self._assembly.land(st, gpus, gid, st.version, self._target.get):
            if f.opens:
                self._boot_engine(f.engine, f.parts, t0)
            else:  # a GPU of the engine failed or went elsewhere: these cannot form it
                for gs, g_id, _ in f.parts:
                    self._orphan(gs, g_id, t0)

    def partner_lost(self, gpu: int, t0: float | None = None) -> None:
        """``gpu`` will not join its engine (it failed, or went to another role): the GPUs
        of the engine waiting for it go IDLE."""
        for gs, gid, _ in self._assembly.lost(self.h.st, gpu):
            self._orphan(gs, gid, time.perf_counter() if t0 is None else t0)

    def _orphan(self, gpus: tuple[int, ...], gid: int, t0: float) -> None:
        """GPUs that switched to rollout but cannot form their engine go IDLE; their group
        reports without them (as the simulator's ``Roles._orphaned``)."""
        grp = self._groups.get(gid)
        if grp is not None:
            grp[1] = tuple(x for x in grp[1] if x not in gpus)
        self._end_switch(gpus, gid, Role.IDLE, t0)

    def _boot_engine(self, e: int, parts: tuple[Part, ...], t0: float) -> None:
        """Start engine ``e``'s actor on its GPUs, every one of which has arrived; once it is
        ready, each switch group that brought GPUs to it reports them."""
        h = self.h
        pub = h.lane.weights.current
        version = pub.version - h.base if pub is not None else 0  # the driver counts from base
        egpus = h.st.engine_gpus(e)
        actor = h.actor_cls.options(**slots_options(egpus, gpus=h.cluster.gpus)).remote(
            h.engine_settings, engine_id=e, version=version)

        def boot() -> dict:
            import ray

            info = wait_ready(actor.info.remote(), f"engine {e}", egpus, h.settings.start_timeout_s)
            if pub is not None:
                info["sync"] = ray.get(actor.update_weights.remote(pub.ref, version))
                info["version"] = version
            return info

        def booted(info: dict) -> None:
            h.stats["engine_start"].append(info["start_seconds"])
            h.rec.event(h.now(), "EngineStart", engine=e, version=info["version"],
                        detail=f"{info['start_seconds']:.2f}s pid={info['pid']}")
            h.rollout.engines[e] = EngineHandle(e, egpus, actor, info["version"], info["kv_capacity"])
            h.st.add_engine(EngineState(e, egpus, info["version"], info["kv_capacity"]))
            for gs, gid, _ in parts:
                self._end_switch(gs, gid, Role.ROLLOUT, t0)

        h.bg(boot, cb=booted)

    def _end_switch(self, gpus: tuple[int, ...], gid: int, role: Role, t0: float) -> None:
        h = self.h
        st, now = h.st, h.now()
        st.set_roles(gpus, role)
        for g in gpus:
            self._target.pop(g, None)
        if role is not Role.ROLLOUT and self._assembly.waiting:
            for g in gpus:  # (a partner of GPUs waiting for their engine went elsewhere)
                self.partner_lost(g, t0)
        if role is Role.ROLLOUT:
            for e in sorted({st.engine_of(g) for g in gpus}):
                h.rollout.touch(e)
        else:
            h.timeline.set(gpus, GpuState.TRAIN_IDLE if role is Role.TRAIN else GpuState.IDLE, now)
        h.rec.event(now, "SwitchEnd", detail=f"{role.value} {ids_text(gpus)} {time.perf_counter() - t0:.2f}s")
        grp = self._groups[gid]
        grp[0] -= len(gpus)
        if grp[0] == 0:
            del self._groups[gid]
            h.stats["switch"].append({"role": role.value, "gpus": len(grp[1]), "seconds": now - grp[3]})
            h.emit(RolesChanged(tuple(grp[1]), grp[2]))
        if role is Role.TRAIN:
            h.training.next_job()

    # ----------------------------------------------------------------- failure
    def engine_failed(self, e: int, exc: BaseException | str, *, failed: int | None = None) -> tuple[str, ...]:
        """An engine actor died: its trajectories stop (finished turns kept), its GPUs go IDLE.
        Returns the trajectories it stopped.

        ``failed``: the GPU a ``[faults]`` gpu fault failed (``loop.fault_inject`` killed the
        actor and reports ``WorkerFailed`` / ``WorkerRecovered`` for that GPU itself, on the
        schedule's recovery time); the engine's other GPUs are IDLE at once, or go on to the
        role a drain was taking them to."""
        h = self.h
        eng = h.rollout.engines.pop(e, None)
        es = h.st.remove_engine(e) if e in h.st.engines_ else None
        if eng is None or es is None:
            return ()
        why = exc if isinstance(exc, str) else str(exc).splitlines()[0][:120]
        h.rec.event(h.now(), "Note", engine=e, detail=f"engine failed: {why}")
        stopped = tuple(list(es.queue) + sorted(es.running))
        for tid in stopped:
            rt = h.rollout.rt[tid]
            rt.pending_abort = rt.want_turn = False
            h.finish(tid, TrajStatus.INTERRUPTED, e)
        if not h.st.engines():
            h.rollout.strand_unbound()  # (no engine left to admit the cluster queue)
        h.st.set_roles(es.gpus, Role.IDLE)
        h.timeline.set(es.gpus, GpuState.IDLE, h.now())
        if failed is not None:
            switch = self._engine_switch.pop(e, None)
            others = tuple(g for g in es.gpus if g != failed)
            if switch is not None:  # it was draining towards a role: the others go on there
                gid, role = switch
                self._group_drop(gid, failed)
                if others:
                    self.start_switch(others, gid, role)
            return stopped
        # The actor died, not the slot: the contract's failure is reported, and the slot is
        # usable again at once (a new engine can start on it), so it recovers immediately.
        for g in es.gpus:
            h.emit(WorkerFailed(g, stopped))
        for g in es.gpus:
            h.emit(WorkerRecovered(g))
        return stopped

    def _group_drop(self, gid: int, g: int) -> None:
        """GPU ``g`` will not finish its switch (it failed): the group reports without it."""
        grp = self._groups.get(gid)
        if grp is None:
            return
        grp[0] -= 1
        grp[1] = tuple(x for x in grp[1] if x != g)
        if grp[0] == 0:
            del self._groups[gid]
            self.h.emit(RolesChanged(tuple(grp[1]), grp[2]))
