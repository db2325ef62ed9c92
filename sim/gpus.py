"""Per-GPU state tracking that turns state changes into run-record intervals.

GPUs change state in groups (an engine's ``tp`` GPUs, the trainer's GPUs), so intervals
are written per contiguous GPU range with a common start, keeping the record small for
1024-GPU clusters.

An engine's GPUs change state about twice per simulated turn (generate <-> tool wait), so
an open engine *owns* its range (:meth:`GpuStates.claim`): it keeps the range's state and
start itself and closes its intervals (``turns.engine_touch``), and the per-GPU
lists are brought up to date only when someone else reads or writes those GPUs
(:meth:`GpuStates.release`, done by every other method here).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any

from rlsched.cluster.ids import GpuState
from rlsched.cluster.record import GPU_STATE_CODE, GPU_STATE_NAMES, RunRecorder

VALUE = {s: s.value for s in GpuState}  # enum .value is a descriptor call; look it up once
CODE = {s: GPU_STATE_CODE[s.value] for s in GpuState}  # a state in the recorder's buffers


class _Group:
    """The trainer's GPUs (runs of consecutive ids) holding one open interval, owned like
    an engine's GPUs (:meth:`GpuStates.claim`); unlike an engine's, the interval has a
    step, and closing it writes one row per run."""

    __slots__ = ("count", "counts", "firsts", "gsince", "gstate", "gstep", "owns", "runs")

    def __init__(self, runs: tuple[tuple[int, int], ...], state: GpuState, since: float, step: int) -> None:
        self.runs = runs
        self.firsts = array("i", [r[0] for r in runs])
        self.counts = array("i", [r[1] for r in runs])
        self.count = sum(self.counts)
        self.gstate, self.gsince, self.gstep = state, since, step
        self.owns = False


class GpuStates:
    def __init__(self, num_gpus: int, recorder: RunRecorder | None) -> None:
        self.state: list[str] = [GpuState.IDLE.value] * num_gpus
        self.since: list[float] = [0.0] * num_gpus
        self.step: list[int] = [-1] * num_gpus
        self.owner: list[Any] = [None] * num_gpus  # engine that holds the GPU's state
        self.rec = recorder
        # GPU-seconds per state, indexed by CODE (engines add theirs in turns.engine_touch)
        self.busy = array("d", bytes(8 * len(CODE)))
        self._group: _Group | None = None  # the trainer's GPUs while they own their state

    # --------------------------------------------------------- ownership
    def claim(self, owner: Any) -> None:
        """``owner`` (an engine: ``first_gpu``, ``tp``, ``gstate``, ``gsince``, ``owns``)
        keeps the state of its GPUs from now on; they must share one open interval (step
        -1) starting at ``owner.gsince`` in state ``owner.gstate``."""
        for g in range(owner.first_gpu, owner.first_gpu + owner.tp):
            self.owner[g] = owner
        owner.owns = True

    def release(self, owner: Any) -> None:
        """Write ``owner``'s state back to its GPUs and stop it owning them."""
        if not owner.owns:
            return
        if type(owner) is _Group:
            self._release_group(owner)
            return
        first, end = owner.first_gpu, owner.first_gpu + owner.tp
        n = end - first
        self.state[first:end] = [VALUE[owner.gstate]] * n
        self.since[first:end] = [owner.gsince] * n
        self.step[first:end] = [-1] * n
        self.owner[first:end] = [None] * n
        owner.owns = False

    def _release_group(self, grp: _Group) -> None:
        st, since, step = VALUE[grp.gstate], grp.gsince, grp.gstep
        for first, n in grp.runs:
            end = first + n
            self.state[first:end] = [st] * n
            self.since[first:end] = [since] * n
            self.step[first:end] = [step] * n
            self.owner[first:end] = [None] * n
        grp.owns = False
        if self._group is grp:
            self._group = None

    def state_of(self, gpu: int) -> str:
        o = self.owner[gpu]
        if o is not None:
            self.release(o)
        return self.state[gpu]

    @property
    def busy_seconds(self) -> dict[str, float]:
        """GPU-seconds spent in each state so far (states never entered left out)."""
        return {name: s for name, s in zip(GPU_STATE_NAMES, self.busy, strict=True) if s}

    # ----------------------------------------------------------- writes
    def set(self, gpus: Iterable[int], state: GpuState, now: float, step: int = -1) -> None:
        gpus = tuple(gpus)
        owner = self.owner
        for g in gpus:
            if owner[g] is not None:
                self.release(owner[g])
        st = VALUE[state]
        run_first = -1
        run_len = 0
        run_key: tuple[float, str, int] | None = None
        for g in gpus:
            if self.state[g] == st and self.step[g] == step:
                continue
            key = (self.since[g], self.state[g], self.step[g])
            if run_key == key and g == run_first + run_len:
                run_len += 1
            else:
                if run_key is not None:
                    self._close(run_first, run_len, run_key, now)
                run_first, run_len, run_key = g, 1, key
            self.state[g], self.since[g], self.step[g] = st, now, step
        if run_key is not None:
            self._close(run_first, run_len, run_key, now)

    def set_runs(self, runs: tuple[tuple[int, int], ...], state: GpuState, now: float, step: int = -1) -> None:
        """:meth:`set` for the GPUs of ``runs`` ((first, count), ascending, disjoint): the
        same per-GPU timeline. The trainer's GPUs change state twice per micro-batch, so
        while they share one open interval they own it as a :class:`_Group` until someone
        else touches them; a change then costs O(1) Python steps (plus a row per run of
        the interval it ends, written as slices). When the trainer grows (GPUs join it
        one engine at a time) only the joining GPUs are written one by one. Pass the same
        ``runs`` object while the trainer's GPUs stay the same (``TrainerSim.runs``)."""
        grp = self._group
        if grp is not None and grp.owns:
            if grp.runs is runs or grp.runs == runs:
                self._move(grp, state, now, step)
                return
            owner = self.owner
            extra = [g for first, n in runs for g in range(first, first + n) if owner[g] is not grp]
            if grp.count + len(extra) == sum(n for _, n in runs):  # (it only grew)
                self._move(grp, state, now, step)
                self.set(extra, state, now, step)
                since, t0 = self.since, grp.gsince
                if all(since[g] == t0 for g in extra):  # one open interval again: one group
                    grp.owns = False
                    self._own(runs, state, t0, step)
                return
            self.release(grp)
        gpus = [g for first, n in runs for g in range(first, first + n)]
        self.set(gpus, state, now, step)
        since = self.since
        if gpus and all(since[g] == since[gpus[0]] for g in gpus):  # one open interval: own it
            self._own(runs, state, since[gpus[0]], step)

    def _own(self, runs: tuple[tuple[int, int], ...], state: GpuState, since: float, step: int) -> None:
        grp = self._group = _Group(runs, state, since, step)
        for first, n in runs:
            self.owner[first:first + n] = [grp] * n
        grp.owns = True

    def _move(self, grp: _Group, state: GpuState, now: float, step: int) -> None:
        """The group's GPUs go to ``state`` (``step``) at ``now``."""
        if grp.gstate is state and grp.gstep == step:
            return
        since = grp.gsince
        if now > since:
            self.busy[CODE[grp.gstate]] += (now - since) * grp.count
            if self.rec is not None:
                self.rec.intervals(grp.firsts, grp.counts, since, now, VALUE[grp.gstate], grp.gstep)
        grp.gstate, grp.gsince, grp.gstep = state, now, step

    def _close(self, first: int, count: int, key: tuple[float, str, int], now: float) -> None:
        since, st, step = key
        if now > since:
            self.busy[GPU_STATE_CODE[st]] += (now - since) * count
            if self.rec is not None:
                self.rec.interval(first, count, since, now, st, step)

    def close_all(self, now: float) -> None:
        """Write every GPU's open interval up to ``now`` (end of the run)."""
        for o in {id(o): o for o in self.owner if o is not None}.values():
            self.release(o)
        first, count, key = 0, 0, None
        for g in range(len(self.state)):
            k = (self.since[g], self.state[g], self.step[g])
            if k == key:
                count += 1
                continue
            if key is not None:
                self._close(first, count, key, now)
            first, count, key = g, 1, k
            self.since[g] = now
        if key is not None:
            self._close(first, count, key, now)
        for g in range(len(self.state)):
            self.since[g] = now
