"""Faults of the ``[faults]`` table injected for real on the live backend.

Why: a fault schedule that ``compare`` simulated must either happen live or be refused --
never be ignored, or the live run is not the run that was compared. What happens for real
so far is the ``tool`` kind: at the fault's time the next tool call (of ``trajectory``, if
given) is armed to hang; that call then runs and holds its sandbox slot, and its trajectory
waits, until ``tool_timeout_s`` has passed, where it is cut: the trajectory continues with
the timeout as the call's result (``ToolTimedOut``), as in the simulator, and nothing is
lost. The events are the simulator's: a ``Fault`` when the fault fires, a ``Fault`` when the
call hangs, ``ToolTimedOut`` when it is cut; ``meta.faults`` counts them under the
simulator's keys. Rate faults (``per_hour``) and the ``gpu``, ``trainer`` and ``sync`` kinds
are refused in one line (:func:`check_live_faults`).
"""

from __future__ import annotations

from typing import Any

from rlsched.cluster.errors import ConfigError
from rlsched.cluster.faults import FaultSchedule

LIVE_KINDS = ("tool",)
# the simulator's meta["faults"] keys that a live tool fault moves (the rest stay 0)
STAT_KEYS = ("faults", "gpu", "trainer", "tool", "sync", "without_effect", "trajectory_interruptions",
             "retried_trajectories", "wasted_tokens", "train_gpu_seconds_lost", "sync_gpu_seconds_lost",
             "tool_seconds_lost", "failed_gpu_seconds", "armed_never_hit")


def check_live_faults(schedule: FaultSchedule | None, *, resume: bool = False) -> None:
    """One line for the first fault the live backend cannot inject for real."""
    if not schedule:
        return
    if resume:
        raise ConfigError("[faults]: a resumed live run does not re-arm its fault schedule; "
                          "resume without [faults] in --config")
    for f in schedule.faults:
        if f.kind not in LIVE_KINDS:
            raise ConfigError(
                f"[faults] fault {f.kind!r}: the live backend injects only {', '.join(map(repr, LIVE_KINDS))} "
                "faults for real so far (a hung tool call); remove it for --live or simulate it with compare"
            )
        if f.per_hour is not None:
            raise ConfigError(
                f"[faults] fault {f.kind!r} per_hour={f.per_hour:g}: rate faults are simulated only; "
                "give the live run explicit ones (at = seconds)"
            )


class LiveFaults:
    """The armed and pending tool faults of one live run, on the run clock."""

    def __init__(self, schedule: FaultSchedule) -> None:
        check_live_faults(schedule)
        self.schedule = schedule
        self.pending = sorted(((float(f.at or 0.0), i, f.trajectory) for i, f in enumerate(schedule.faults)),
                              reverse=True)  # popped from the end: earliest first
        self.hangs: list[str | None] = []  # armed: whose next tool call hangs (None: anyone's)
        self.stats: dict[str, float] = dict.fromkeys(STAT_KEYS, 0)

    @property
    def limit(self) -> float:
        return self.schedule.tool_timeout_s

    def next_at(self) -> float | None:
        return self.pending[-1][0] if self.pending else None

    def fire_due(self, now: float) -> list[str]:
        """Arm the faults due by ``now``; returns the ``Fault`` event details to record."""
        notes = []
        while self.pending and self.pending[-1][0] <= now:
            _, _, target = self.pending.pop()
            self.hangs.append(target)
            self.stats["faults"] += 1
            self.stats["tool"] += 1
            notes.append(f"tool: next tool call of {target or 'any trajectory'} hangs (cut at {self.limit:g}s)")
        return notes

    def take_hang(self, tid: str) -> float | None:
        """The cut (seconds) if ``tid``'s tool call starting now is armed to hang, else None."""
        for k, target in enumerate(self.hangs):
            if target is None or target == tid:
                del self.hangs[k]
                return self.limit
        return None

    def cut(self, seconds: float) -> float:
        """A hung call that the tools themselves took ``seconds`` for lasts this long."""
        cut = max(self.limit, seconds)
        self.stats["tool_seconds_lost"] += cut - seconds
        return cut

    def close(self) -> dict[str, Any]:
        return {**self.stats, "armed_never_hit": len(self.hangs)}  # as simulated: armed, never hit
