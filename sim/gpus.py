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


class _Span:
    """Consecutive trainer GPUs holding one open interval, owned like an engine's GPUs
    (:meth:`GpuStates.claim`); unlike an engine's, the interval has a step."""

    __slots__ = ("first_gpu", "gsince", "gstate", "gstep", "owns", "tp")

    def __init__(self, first: int, count: int, state: GpuState, since: float, step: int) -> None:
        self.first_gpu, self.tp = first, count
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
        self._spans: dict[tuple[int, int], _Span] = {}  # see set_runs
        self._spans_of: tuple[tuple[int, int], ...] = ()

    # --------------------------------------------------------- ownership
    def claim(self, owner: Any) -> None:
        """``owner`` (``first_gpu``, ``tp``, ``gstate``, ``gsince``, ``owns``) keeps the
        state of its GPUs from now on; they must share one open interval (step -1, or a
        :class:`_Span`'s ``gstep``) starting at ``owner.gsince`` in state ``owner.gstate``."""
        for g in range(owner.first_gpu, owner.first_gpu + owner.tp):
            self.owner[g] = owner
        owner.owns = True

    def release(self, owner: Any) -> None:
        """Write ``owner``'s state back to its GPUs and stop it owning them."""
        if not owner.owns:
            return
        first, end = owner.first_gpu, owner.first_gpu + owner.tp
        n = end - first
        self.state[first:end] = [VALUE[owner.gstate]] * n
        self.since[first:end] = [owner.gsince] * n
        self.step[first:end] = [owner.gstep if type(owner) is _Span else -1] * n
        self.owner[first:end] = [None] * n
        owner.owns = False

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
        same intervals. The trainer's GPUs change state twice per micro-batch, run by run,
        so each run owns its GPUs' state like an engine (:class:`_Span`) until someone
        else touches them, and a change costs O(1) Python steps per run. Pass the same
        ``runs`` object while the trainer's GPUs stay the same (``TrainerSim.runs``)."""
        spans = self._spans
        if runs is not self._spans_of:  # (spans of runs no longer passed are released when touched)
            spans = self._spans = {r: spans[r] for r in runs if r in spans}
            self._spans_of = runs
        since = self.since
        for r in runs:
            sp = spans.get(r)
            if sp is not None and sp.owns:
                if sp.gstate is not state or sp.gstep != step:
                    self._close(sp.first_gpu, sp.tp, (sp.gsince, VALUE[sp.gstate], sp.gstep), now)
                    sp.gstate, sp.gsince, sp.gstep = state, now, step
                continue
            first, count = r
            self.set(range(first, first + count), state, now, step)
            if since[first:first + count].count(since[first]) == count:  # one open interval: own it
                sp = spans[r] = _Span(first, count, state, since[first], step)
                self.claim(sp)

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
