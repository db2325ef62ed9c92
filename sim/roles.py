"""Roles in the simulator: reassigning GPUs (draining engines first), role switches and
their cost, and the engines they open and close.

An engine's GPU state (generate / tool wait / idle / sync) is recomputed after every
change to the engine, which is several times per simulated turn (the rollout core's
``engine_touch``, :mod:`.turns`); it is written to the run record only when it actually
changes, so the common case is one comparison.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rlsched.cluster.events import RolesChanged
from rlsched.cluster.ids import Drain, GpuState, Role
from rlsched.cluster.loop.assembly import Assembly
from rlsched.cluster.loop.trainer_queue import TrainerQueue
from rlsched.cluster.record import ids_text

from .engine import EngineSim
from .memory import reshard_s

if TYPE_CHECKING:
    from .lifecycle import Lifecycle
    from .training import Training


class Roles:
    """What GPUs do: ``Reassign`` and the role switches it starts.

    Owns the switch bookkeeping: ``_switch_groups`` (Reassign group -> [GPUs still
    switching, its GPUs, target role]; a group reports ``RolesChanged`` when its last GPU
    lands), ``_group_seq`` (group ids), ``_switch_gid`` (GPU -> the group it switches
    with) and ``_engine_switch`` (draining engine -> the group and role its GPUs switch
    to once it is empty). Calls the rollout core (``core``: opens, drains and closes
    engines, timers), the trainer (``training.trainer``: GPUs joining and leaving it) and
    the trainer queue (``queue``: a grown trainer may start the next job); writes GPU
    roles in the store (``state.roles``) and GPU states in ``core.gpus``.
    """

    def __init__(self, core: Lifecycle, training: Training) -> None:
        self.core = core
        self.training = training
        self.state = core.state
        self.gpus = core.gpus
        self.cost = core.cost
        self.rec = core.rec
        self._switch_groups: dict[int, list] = {}
        self._group_seq = 0
        self._switch_gid: dict[int, int] = {}
        self._engine_switch: dict[int, tuple[int, Role]] = {}
        self._assembly = Assembly()  # GPUs landed in rollout, waiting for their engine's rest

    def attach(self, queue: TrainerQueue) -> None:
        self.queue = queue

    # -------------------------------------------------------------- roles
    def reassign(self, gpus: Sequence[int], role: Role, drain: Drain) -> None:
        """``Reassign``: engines drain first, trainer GPUs wait for the running job,
        the rest switch now (see :meth:`start_switch`)."""
        self._group_seq += 1
        gid = self._group_seq
        self._switch_groups[gid] = [len(gpus), gpus, role]
        st = self.state
        by_engine: dict[int, list[int]] = {}
        direct: list[int] = []  # not serving an engine nor held by a running trainer job
        for g in gpus:
            if st.roles[g] is Role.ROLLOUT:
                by_engine.setdefault(st.engine_of(g), []).append(g)
            elif st.roles[g] is Role.TRAIN and self.queue.running is not None:
                st.leave_train_later(g, gid, role)
            else:
                direct.append(g)
        if direct:  # they switch together (as live: one SwitchStart for them)
            self.start_switch(tuple(direct), gid, role)
        for e in sorted(by_engine):
            self._drain_engine(self.core.engines[e], gid, role, drain)

    def release_leaving(self) -> None:
        """The trainer's job ended (or was aborted): GPUs asked to leave training go now,
        those of one Reassign together."""
        leaving = self.state.take_leaving()
        if not leaving:
            return
        by_group: dict[tuple[int, Role], list[int]] = {}
        for g, key in sorted(leaving.items()):
            by_group.setdefault(key, []).append(g)  # type: ignore[arg-type]
        for (gid, role), gs in by_group.items():
            self.start_switch(tuple(gs), gid, role)

    def _drain_engine(self, eng: EngineSim, gid: int, role: Role, drain: Drain) -> None:
        eng.es.drain()
        eng.count_out()
        self._engine_switch[eng.id] = (gid, role)
        self.core.evacuate(eng, drain)
        self.maybe_close_engine(eng)

    def maybe_close_engine(self, eng: EngineSim) -> None:
        """A draining engine that holds no trajectory closes; its GPUs switch on."""
        es = eng.es
        if eng.closed or not es.draining or es.running or es.queue:
            return
        gid, role = self._engine_switch.pop(eng.id)
        self.core.close_engine(eng)
        self.start_switch(es.gpus, gid, role)

    def start_switch(self, gpus: tuple[int, ...], gid: int, role: Role) -> None:
        st = self.state
        now = self.core.now
        switch_gid = self._switch_gid
        roles = st.roles
        training = [g for g in gpus if roles[g] is Role.TRAIN]
        if training:
            self.training.trainer.remove_all(training)
        st.set_roles(gpus, Role.SWITCHING)
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
        if self.training.layout.memory is not None:  # the trainer's state moves (see .memory.reshard_s)
            seconds += self._reshard(gpus, role, len(training))
        # (the weights an engine will serve are loaded as its switch starts: the trainer's
        # version now, even if a newer one is published before the switch ends -- as on a
        # real cluster, and as sim/bound.py's refresh term assumes)
        self.core.later(seconds, self._end_switch, gpus, (gid, role, st.version))

    def _reshard(self, gpus: tuple[int, ...], role: Role, leaving: int) -> float:
        """Seconds of resharding the trainer's state that GPUs ``gpus`` add to their switch:
        joining ones receive their shard; leaving ones hand theirs to those that stay, and
        the trainer runs nothing until that is done."""
        tr = self.training.trainer
        layout = self.training.layout
        have = len(tr.gpus)  # (the leaving ones are already out)
        n = self.cost.gpus_per_node or 8
        near = {g // n for g in tr.gpus}
        local = bool(near) and all(g // n in near for g in gpus)
        if role is Role.TRAIN:
            return reshard_s(self.cost, layout, have, have + len(gpus), local)
        if not leaving:
            return 0.0
        secs = reshard_s(self.cost, layout, have + leaving, have, local)
        if have and secs > 0.0:
            tr.restart_until = max(tr.restart_until, self.core.now + secs)
            self.core.later(secs, self._kick_trainer)
        return secs

    def _kick_trainer(self, _a: object, _b: object) -> None:
        self.queue.next()

    def _end_switch(self, gpus: tuple[int, ...], group: tuple[int, Role, int]) -> None:
        gid, role, version = group
        st = self.state
        now = self.core.now
        switch_gid = self._switch_gid
        if any(switch_gid.get(g) != gid for g in gpus):  # some failed meanwhile (see .faults)
            gpus = tuple(g for g in gpus if switch_gid.get(g) == gid)
            if not gpus:
                return
        if role is Role.ROLLOUT:
            self._land_rollout(gpus, gid, version)
            return
        if self._assembly.waiting:  # a partner of GPUs waiting for their engine went elsewhere
            for g in gpus:
                self._unpark_lost(g)
        st.set_roles(gpus, role)
        for g in gpus:
            del switch_gid[g]
        if role is Role.TRAIN:
            self.training.trainer.add(gpus)
            self.gpus.set(gpus, GpuState.TRAIN_IDLE, now)
        else:
            self.gpus.set(gpus, GpuState.IDLE, now)
        self._ended(gpus, gid, role)
        if role is Role.TRAIN:
            self.queue.next()

    def _ended(self, gpus: tuple[int, ...], gid: int, role: Role) -> None:
        """GPUs of group ``gid`` are done switching: the group reports once its last is."""
        if self.rec is not None:
            self.rec.event(self.core.now, "SwitchEnd", detail=f"{role.value} {ids_text(gpus)}")
        grp = self._switch_groups[gid]
        grp[0] -= len(gpus)
        if grp[0] == 0:
            del self._switch_groups[gid]
            self.core.emit(RolesChanged(tuple(grp[1]), grp[2]))

    def _land_rollout(self, gpus: tuple[int, ...], gid: int, version: int) -> None:
        """GPUs finished switching to rollout: an engine opens once every GPU of it has
        (:mod:`rlsched.cluster.loop.assembly`); until then these wait, SWITCHING."""
        st = self.state
        formed = self._assembly.land(st, gpus, gid, version, self._switching_to)
        if not formed:
            return
        switch_gid = self._switch_gid
        for f in formed:
            for gs, _, _ in f.parts:
                if f.opens:  # (the others go IDLE: _orphaned)
                    st.set_roles(gs, Role.ROLLOUT)
                for g in gs:
                    del switch_gid[g]
        for f in formed:
            if f.opens:
                self.core.open_engine(f.engine, f.version)
            else:  # a GPU of the engine failed during the switch: no engine, these idle
                for gs, g_id, _ in f.parts:
                    self._orphaned(gs, g_id)
        done = {g for f in formed for g in f.parts[0][0]}  # (this landing's part comes first)
        self._ended(tuple(g for g in gpus if g in done), gid, Role.ROLLOUT)
        for f in formed:
            for gs, g_id, _ in f.parts[1:]:
                self._ended(gs, g_id, Role.ROLLOUT)

    def _unpark_lost(self, gpu: int) -> None:
        """``gpu`` will not join its engine (failed, or landed in another role): the GPUs of
        the engine waiting for it go IDLE and their groups report."""
        for gs, gid, _ in self._assembly.lost(self.state, gpu):
            for g in gs:
                del self._switch_gid[g]
            self._orphaned(gs, gid)
            self._ended(gs, gid, Role.ROLLOUT)

    def _switching_to(self, g: int) -> Role | None:
        """The role GPU ``g`` is switching to (None: it is not switching)."""
        grp = self._switch_groups.get(self._switch_gid.get(g, -1))
        return None if grp is None else grp[2]

    def _orphaned(self, gpus: tuple[int, ...], gid: int) -> None:
        """GPUs that switched to ROLLOUT but cannot form their engine go IDLE; their group
        reports without them."""
        self.state.set_roles(gpus, Role.IDLE)
        self.gpus.set(gpus, GpuState.IDLE, self.core.now)
        grp = self._switch_groups.get(gid)
        if grp is not None:
            grp[1] = tuple(x for x in grp[1] if x not in gpus)

    # ------------------------------------------------- a GPU fails (see .faults)
    def take_switch(self, e: int) -> tuple[int, Role] | None:
        """Engine ``e`` is lost: the group and role its GPUs were draining towards, if any."""
        return self._engine_switch.pop(e, None)

    def cut_switch(self, g: int) -> None:
        """GPU ``g`` failed while switching: its group reports without it."""
        gid = self._switch_gid.pop(g, None)
        if gid is not None:
            self.group_drop(gid, g)
        self._unpark_lost(g)  # (its engine's GPUs waiting for it, or it waiting for them)

    def cut_leaving(self, g: int) -> None:
        """Trainer GPU ``g`` failed while waiting to leave: its group reports without it."""
        leaving = self.state.cancel_leaving(g)
        if leaving is not None:
            self.group_drop(leaving[0], g)
            self._unpark_lost(g)

    def group_drop(self, gid: int, g: int) -> None:
        """GPU ``g`` will not finish its switch (it failed): the group reports without it."""
        grp = self._switch_groups.get(gid)
        if grp is None:
            return
        grp[0] -= 1
        grp[1] = tuple(x for x in grp[1] if x != g)
        if grp[0] == 0:
            del self._switch_groups[gid]
            self.core.emit(RolesChanged(tuple(grp[1]), grp[2]))
