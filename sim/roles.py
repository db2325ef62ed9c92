"""Roles and engines in the simulator: reassigning GPUs (draining engines first), role
switches, opening engines, least-loaded routing and per-engine GPU state.

An engine's GPU state (generate / tool wait / idle / sync) is recomputed after every
change to the engine, which is several times per simulated turn; it is written to the run
record only when it actually changes, so the common case is one comparison.
"""

from __future__ import annotations

import heapq

from rlsched.cluster.events import RolesChanged
from rlsched.cluster.ids import Drain, GpuState, Role
from rlsched.cluster.record import ids_text
from rlsched.cluster.state import EngineState

from .core import DriverCore
from .engine import EngineSim
from .gpus import CODE
from .traj import SimTraj
from .turns import engine_touch


class Roles(DriverCore):
    """Methods of :class:`~rlsched.sim.driver.SimDriver` that change what GPUs do."""

    # ------------------------------------------------------------- routing
    def _dispatch_all(self, tids: tuple[str, ...], e: int | None) -> None:
        """``Dispatch``: to engine ``e``, or each to the least-loaded engine at the time.

        Least-loaded is (running + queued, engine id), as ``ClusterState.least_loaded``;
        during one Dispatch only the engine just dispatched to changes load, so a heap of
        (load, id) gives the same choices in O(log engines) each.
        """
        trajs = self.trajs
        if e is not None:
            eng = self.engines[e]
            for tid in tids:
                self._dispatch(trajs[tid], eng)
            return
        if not tids:
            return
        heap = [(load, e) for e, load in self.state.engine_loads()]
        if not heap:
            self.state.least_loaded()  # raises the PolicyError for "no rollout engine"
        heapq.heapify(heap)
        engines = self.engines
        for tid in tids:
            eng = engines[heap[0][1]]
            self._dispatch(trajs[tid], eng)
            es = eng.es
            heapq.heapreplace(heap, (es.load, eng.id))

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
            elif st.roles[g] is Role.TRAIN and self.trainer.running is not None:
                self.trainer.leaving[g] = (gid, role)
            else:
                direct.append(g)
        if direct:  # they switch together (as live: one SwitchStart for them)
            self._start_switch(tuple(direct), gid, role)
        for e in sorted(by_engine):
            self._drain_engine(self.engines[e], gid, role, drain)

    def _release_leaving(self) -> None:
        """The trainer's job ended (or was aborted): GPUs asked to leave training go now,
        those of one Reassign together."""
        leaving = self.trainer.leaving
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
        for tid in list(es.queue) + sorted(es.running):
            t: SimTraj = trajs[tid]
            if drain is Drain.INTERRUPT:
                self._interrupt(t, keep=True)
            elif drain is Drain.MIGRATE or tid in es.queue or t.in_env:
                self._move_out(t, eng)
        self._maybe_close_engine(eng)

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
        self._later(seconds, self._end_switch, gpus, (gid, role))

    def _end_switch(self, gpus: tuple[int, ...], group: tuple[int, Role]) -> None:
        gid, role = group
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
                    self._open_engine(e)
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
            self._trainer_next()

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

    def _open_engine(self, e: int) -> None:
        if e in self.engines:
            # Called once per GPU of the engine whose switch ends (all at one instant): the
            # first call opens it; later ones keep it. (Replacing it would drop trajectories
            # a policy dispatched to it in between, e.g. on its EngineIdle.)
            return
        gpus = self.state.engine_gpus(e)
        v = self.state.version
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
        self._engine_touch(eng)

    # ---------------------------------------------------------- GPU state
    def _engine_touch(self, eng: EngineSim) -> None:
        """Recompute the engine's GPU state after a change; report an idle engine."""
        engine_touch(self, eng)
