"""Roles and engines in the simulator: reassigning GPUs (draining engines first), role
switches, opening engines, least-loaded routing and per-engine GPU state.

An engine's GPU state (generate / tool wait / idle / sync) is recomputed after every
change to the engine, which is several times per simulated turn; it is written to the run
record only when it actually changes, so the common case is one comparison.
"""

from __future__ import annotations

from rlsched.cluster.events import RolesChanged
from rlsched.cluster.ids import Drain, GpuState, Role
from rlsched.cluster.record import ids_text
from rlsched.cluster.state import EngineState

from .core import DriverCore
from .engine import EngineSim
from .gpus import CODE
from .memory import reshard_s
from .turns import engine_touch


class Roles(DriverCore):
    """Methods of :class:`~rlsched.sim.driver.SimDriver` that change what GPUs do."""

    # ------------------------------------------------------------- routing
    def _dispatch_all(self, tids: tuple[str, ...], e: int | None) -> None:
        """``Dispatch``: pinned to engine ``e``, or (None) into the cluster queue, which
        is then placed: each on the least-loaded engine (running + queued, engine id) on
        which it fits (see ``Lifecycle._place_all``)."""
        trajs = self.trajs
        if e is not None:
            eng = self.engines[e]
            for tid in tids:
                self._dispatch(trajs[tid], eng)
            return
        if not tids:
            return
        if not self.state.engines():
            self.state.least_loaded()  # raises the PolicyError for "no rollout engine"
        for tid in tids:
            self._dispatch_unbound(trajs[tid])
        self._place_all()

    # -------------------------------------------------------------- roles
    def _reassign(self, gpus: tuple[int, ...], role: Role, drain: Drain) -> None:
        self._group_seq += 1
        gid = self._group_seq
        self._switch_groups[gid] = [len(gpus), gpus, role]
        st = self.state
        by_engine: dict[int, list[int]] = {}
        direct: list[int] = []  # not serving an engine nor held by a running trainer job
        for g in gpus:
            if st.roles[g] is Role.ROLLOUT:
                by_engine.setdefault(st.engine_of(g), []).append(g)
            elif st.roles[g] is Role.TRAIN and self.loop.trainer.running is not None:
                st.leaving_train[g] = (gid, role)
            else:
                direct.append(g)
        if direct:  # they switch together (as live: one SwitchStart for them)
            self._start_switch(tuple(direct), gid, role)
        for e in sorted(by_engine):
            self._drain_engine(self.engines[e], gid, role, drain)

    def _release_leaving(self) -> None:
        """The trainer's job ended (or was aborted): GPUs asked to leave training go now,
        those of one Reassign together."""
        leaving = self.state.leaving_train
        if not leaving:
            return
        by_group: dict[tuple[int, Role], list[int]] = {}
        for g, key in sorted(leaving.items()):
            by_group.setdefault(key, []).append(g)  # type: ignore[arg-type]
        leaving.clear()
        for (gid, role), gs in by_group.items():
            self._start_switch(tuple(gs), gid, role)

    def _drain_engine(self, eng: EngineSim, gid: int, role: Role, drain: Drain) -> None:
        es = eng.es
        es.drain()
        eng.count_out()
        self._engine_switch[eng.id] = (gid, role)
        others = [x for x in self.state.engines_.values() if not x.draining]
        if drain is not Drain.INTERRUPT and not others and (es.running or es.queue):
            drain = Drain.INTERRUPT  # nowhere to migrate to: keep progress, stop here
        trajs = self.trajs
        if not others:
            self._strand_unbound()
        members = list(es.queue) + sorted(es.running)
        if drain is Drain.INTERRUPT:
            for tid in members:
                self._interrupt(trajs[tid], keep=True)
        else:
            # to the cluster queue's head, keeping their order there
            queued = set(es.queue)
            moving = [tid for tid in members
                      if drain is Drain.MIGRATE or tid in queued or trajs[tid].in_env]
            for tid in reversed(moving):
                self._move(trajs[tid], eng, None)
            if moving:
                self._place_all()
        self._maybe_close_engine(eng)

    def _strand_unbound(self) -> None:
        """No active rollout engine is left: the cluster queue's trajectories stop, their
        finished turns kept (as those on a drained engine's queue), for the policy to
        dispatch again once engines are back."""
        st = self.state
        while st.unbound:
            self._interrupt(self.trajs[st.unbound[0]], keep=True)

    def _maybe_close_engine(self, eng: EngineSim) -> None:
        es = eng.es
        if eng.closed or not es.draining or es.running or es.queue:
            return
        gid, role = self._engine_switch.pop(eng.id)
        del self.engines[eng.id]
        eng.closed = True
        self.gpus.release(eng)
        eng.wake_at = float("inf")
        self.state.remove_engine(eng.id)
        self._start_switch(es.gpus, gid, role)

    def _start_switch(self, gpus: tuple[int, ...], gid: int, role: Role) -> None:
        st = self.state
        now = self.now
        switch_gid = self._switch_gid
        roles = st.roles
        training = [g for g in gpus if roles[g] is Role.TRAIN]
        if training:
            self.trainer.remove_all(training)
        roles.assign(gpus, Role.SWITCHING)
        for g in gpus:
            switch_gid[g] = gid
        self.gpus.set(gpus, GpuState.SWITCH, now)
        if self.rec is not None:
            self.rec.event(now, "SwitchStart", detail=f"{role.value} {ids_text(gpus)}")
        # Live, the GPUs of one Reassign switch at once and share the host (engines boot
        # side by side; the trainer grows rank by rank), so the per-GPU term counts the
        # command's GPUs, not only this engine's.
        grp = self._switch_groups.get(gid)
        seconds = self.cost.switch_seconds(role.value, len(grp[1]) if grp else len(gpus))
        if self.layout.memory is not None:  # the trainer's state moves (see .memory.reshard_s)
            seconds += self._reshard(gpus, role, len(training))
        # (the weights an engine will serve are loaded as its switch starts: the trainer's
        # version now, even if a newer one is published before the switch ends -- as on a
        # real cluster, and as sim/bound.py's refresh term assumes)
        self._later(seconds, self._end_switch, gpus, (gid, role, st.version))

    def _reshard(self, gpus: tuple[int, ...], role: Role, leaving: int) -> float:
        """Seconds of resharding the trainer's state that GPUs ``gpus`` add to their switch:
        joining ones receive their shard; leaving ones hand theirs to those that stay, and
        the trainer runs nothing until that is done."""
        tr = self.trainer
        have = len(tr.gpus)  # (the leaving ones are already out)
        n = self.cost.gpus_per_node or 8
        near = {g // n for g in tr.gpus}
        local = bool(near) and all(g // n in near for g in gpus)
        if role is Role.TRAIN:
            return reshard_s(self.cost, self.layout, have, have + len(gpus), local)
        if not leaving:
            return 0.0
        secs = reshard_s(self.cost, self.layout, have + leaving, have, local)
        if have and secs > 0.0:
            tr.restart_until = max(tr.restart_until, self.now + secs)
            self._later(secs, self._kick_trainer)
        return secs

    def _kick_trainer(self, _a: object, _b: object) -> None:
        self.loop.trainer.next()

    def _end_switch(self, gpus: tuple[int, ...], group: tuple[int, Role, int]) -> None:
        gid, role, version = group
        st = self.state
        now = self.now
        switch_gid = self._switch_gid
        if any(switch_gid.get(g) != gid for g in gpus):  # some failed meanwhile (see .faults)
            gpus = tuple(g for g in gpus if switch_gid.get(g) == gid)
            if not gpus:
                return
        st.roles.assign(gpus, role)
        for g in gpus:
            del switch_gid[g]
        if role is Role.ROLLOUT:
            for e in sorted({st.engine_of(g) for g in gpus}):
                # (a partner still switching must be switching to rollout: one that failed
                # during the switch and recovered may since have been sent to train)
                if all(st.roles[x] is Role.ROLLOUT or self._switching_to(x) is Role.ROLLOUT
                       for x in st.engine_gpus(e)):
                    self._open_engine(e, version)
                else:  # a GPU of the engine failed during the switch: no engine, these idle
                    self._orphaned(tuple(g for g in gpus if st.engine_of(g) == e), gid)
        elif role is Role.TRAIN:
            self.trainer.add(gpus)
            self.gpus.set(gpus, GpuState.TRAIN_IDLE, now)
        else:
            self.gpus.set(gpus, GpuState.IDLE, now)
        if self.rec is not None:
            self.rec.event(now, "SwitchEnd", detail=f"{role.value} {ids_text(gpus)}")
        grp = self._switch_groups[gid]
        grp[0] -= len(gpus)
        if grp[0] == 0:
            del self._switch_groups[gid]
            self._emit(RolesChanged(tuple(grp[1]), grp[2]))
        if role is Role.TRAIN:
            self.loop.trainer.next()

    def _switching_to(self, g: int) -> Role | None:
        """The role GPU ``g`` is switching to (None: it is not switching)."""
        grp = self._switch_groups.get(self._switch_gid.get(g, -1))
        return None if grp is None else grp[2]

    def _orphaned(self, gpus: tuple[int, ...], gid: int) -> None:
        """GPUs that switched to ROLLOUT but cannot form their engine go IDLE; their group
        reports without them."""
        st = self.state
        for g in gpus:
            st.roles[g] = Role.IDLE
        self.gpus.set(gpus, GpuState.IDLE, self.now)
        grp = self._switch_groups.get(gid)
        if grp is not None:
            grp[1] = tuple(x for x in grp[1] if x not in gpus)

    def _open_engine(self, e: int, v: int) -> None:
        """Engine ``e``'s GPUs finished switching to rollout: it opens with weights ``v``
        (the trainer's version when the switch started)."""
        if e in self.engines:
            # Called once per GPU of the engine whose switch ends (all at one instant): the
            # first call opens it; later ones keep it. (Replacing it would drop trajectories
            # a policy dispatched to it in between, e.g. on its EngineIdle.)
            return
        gpus = self.state.engine_gpus(e)
        es = EngineState(e, gpus, v, self.kv_capacity)
        self.state.add_engine(es)
        eng = EngineSim(e, gpus[0], self.cfg.tp, self.cost, self.kv_capacity, version=v, es=es)
        eng.updated = eng.stall_end = self.now
        eng.queue, eng.eid, eng.wake_callbacks = self._queue, self._eid, self._wake_callbacks
        eng.count_in(self.kv_pool)
        # An engine opens once per GPU of it whose switch ends (all at one instant); it
        # reports EngineIdle only if its GPUs were not already idle rollout.
        eng.gstate = GpuState(self.gpus.state_of(gpus[0]))
        eng.gcode = CODE[eng.gstate]
        self.engines[e] = eng
        self._admit(eng)  # (takes work waiting in the cluster queue; reports EngineIdle else)

    # ---------------------------------------------------------- GPU state
    def _engine_touch(self, eng: EngineSim) -> None:
        """Recompute the engine's GPU state after a change; report an idle engine."""
        engine_touch(self, eng)
