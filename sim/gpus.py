"""Per-GPU state tracking that turns state changes into run-record intervals.

GPUs change state in groups (an engine's ``tp`` GPUs, the trainer's GPUs), so intervals
are written per contiguous GPU range with a common start, keeping the record small for
1024-GPU clusters.
"""

from __future__ import annotations

from collections.abc import Iterable

from rlsched.cluster.ids import GpuState
from rlsched.cluster.record import RunRecorder


class GpuStates:
    def __init__(self, num_gpus: int, recorder: RunRecorder | None) -> None:
        self.state: list[str] = [GpuState.IDLE.value] * num_gpus
        self.since: list[float] = [0.0] * num_gpus
        self.step: list[int] = [-1] * num_gpus
        self.rec = recorder
        self.busy_seconds: dict[str, float] = {}

    def set(self, gpus: Iterable[int], state: GpuState, now: float, step: int = -1) -> None:
        st = state.value
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

    def _close(self, first: int, count: int, key: tuple[float, str, int], now: float) -> None:
        since, st, step = key
        if now > since:
            self.busy_seconds[st] = self.busy_seconds.get(st, 0.0) + (now - since) * count
            if self.rec is not None:
                self.rec.interval(first, count, since, now, st, step)

    def close_all(self, now: float) -> None:
        """Write every GPU's open interval up to ``now`` (end of the run)."""
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
