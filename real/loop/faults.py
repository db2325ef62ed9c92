"""Faults of the ``[faults]`` table injected for real on the live backend: which ones, when.

Why: a fault schedule that ``compare`` simulated must either happen live or be refused --
never be ignored, or the live run is not the run that was compared. This module is the
schedule's state on the run clock (what is pending, what is armed, what it cost, under
the simulator's ``meta.faults`` keys); ``loop.fault_inject`` does what each fault does to
the running engines, trainer and tools. What happens for real:

``tool``
    At the fault's time the next tool call (of ``trajectory``, if given) is armed to hang;
    that call then runs and holds its sandbox slot, and its trajectory waits, until
    ``tool_timeout_s`` has passed, where it is cut: the trajectory continues with the
    timeout as the call's result (``ToolTimedOut``), as in the simulator.
``sync``
    The next weight sync to *start* at or after the fault's time fails: each engine
    receives the weights and refuses to load them (``engine.SyncRefused``), so it keeps the
    weights it had and goes on generating; ``SyncFailed`` is reported and the same engines
    are synced again (to the trainer's version then) after ``sync_retry_s``. (The
    simulator fails the next sync to *end* after the fault time: the same sync unless one
    is in flight when the fault fires.) A sync of version 0 (no weights published yet)
    sends nothing live, so it cannot fail.
``gpu``
    The engine actor holding the GPU is killed (``ray.kill``): its trajectories stop with
    their finished turns kept (``TrajectoryFinished`` interrupted, then ``WorkerFailed``),
    the GPU is ``failed`` until ``recover_s`` has passed (``WorkerRecovered``), and the
    policy dispatches the trajectories again. An idle GPU is simply unusable until it
    recovers. A trainer GPU's failure loses the step's gradients, as simulated: the
    trainer's ranks are killed, the step's micro-batches re-queued, and the trainer
    restarts without the GPU after ``restart_s`` from the last step's checkpoint (with no
    GPU left, when the policy gives it GPUs again). A GPU switching roles (or in a trainer
    resize) when the fault fires fails the moment its switch ends (the simulator cuts the
    switch short; a booting engine or a resizing trainer is not interrupted live). A fault
    without ``gpu=`` picks a working GPU with the schedule's seeded RNG, as simulated.
``trainer``
    The next training job to run at or after the fault's time crashes (at once, if one is
    running when the fault fires): the trainer's rank processes are killed
    (``ray.kill``), the job fails for real, and the step's gradients are gone. As in the
    simulator, ``TrainerFailed`` is reported, the step's finished micro-batches and the
    lost job are re-queued ahead of queued work, and the trainer restarts after
    ``restart_s`` -- new ranks on the same slots, loaded from the last completed optimizer
    step's checkpoint (the last weights published). (The simulator crashes the
    trainer at the fault's time even between jobs, where only the restart is lost; live, a
    crash between jobs would kill nothing that holds work, so it waits for the next job.)
    With no trainer GPU when it fires, it has no effect, as simulated.

Refused in one line (:func:`check_live_faults`): rate faults (``per_hour``) and any schedule
on a resumed run.
"""

from __future__ import annotations

import random
from typing import Any

from rlsched.cluster.errors import ConfigError
from rlsched.cluster.faults import Fault, FaultSchedule

LIVE_KINDS = ("tool", "sync", "gpu", "trainer")
# the simulator's meta["faults"] keys
STAT_KEYS = ("faults", "gpu", "trainer", "tool", "sync", "without_effect", "trajectory_interruptions",
             "retried_trajectories", "wasted_tokens", "train_gpu_seconds_lost", "sync_gpu_seconds_lost",
             "tool_seconds_lost", "failed_gpu_seconds", "armed_never_hit")

def check_live_faults(schedule: FaultSchedule | None, *, resume: bool = False, gpus: int | None = None) -> None:
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
                "faults for real; remove it for --live or simulate it with compare"
            )
        if f.per_hour is not None:
            raise ConfigError(
                f"[faults] fault {f.kind!r} per_hour={f.per_hour:g}: rate faults are drawn during a simulated "
                "run (one RNG shared with GPU picks, in simulated-time order), so they have no fixed times a "
                "live run could replay; give the live run explicit ones (at = seconds)"
            )
    if gpus is not None:
        schedule.check_gpus(gpus)


class LiveFaults:
    """The pending and armed faults of one live run, on the run clock, and what they cost."""

    def __init__(self, schedule: FaultSchedule, *, gpus: int | None = None) -> None:
        check_live_faults(schedule, gpus=gpus)
        self.schedule = schedule
        self.pending: list[tuple[float, int, Fault]] = sorted(
            ((float(f.at or 0.0), i, f) for i, f in enumerate(schedule.faults)),
            key=lambda x: (x[0], x[1]), reverse=True)  # popped from the end: earliest first
        self.hangs: list[str | None] = []  # armed: whose next tool call hangs (None: anyone's)
        self.sync_fails = 0  # armed: the next weight sync fails (at most one at a time)
        self.trainer_armed = 0  # armed: the next training job crashes the trainer
        self.switching: list[tuple[Fault, int]] = []  # gpu faults waiting for their GPU's switch
        self.rng = random.Random(schedule.seed)  # GPU picks of faults without gpu=
        self.fail_since: dict[int, float] = {}  # failed GPU -> when
        self.fail_token: dict[int, int] = {}  # failed GPU -> which failure (a recovery is for one)
        self.hit: set[str] = set()  # trajectories a fault interrupted
        self.stats: dict[str, float] = dict.fromkeys(STAT_KEYS, 0)

    @property
    def limit(self) -> float:
        return self.schedule.tool_timeout_s

    def next_at(self) -> float | None:
        return self.pending[-1][0] if self.pending else None

    def due(self, now: float) -> list[Fault]:
        """The faults whose time has come by ``now``, earliest first (each counted fired)."""
        out = []
        while self.pending and self.pending[-1][0] <= now:
            f = self.pending.pop()[2]
            self.stats["faults"] += 1
            self.stats[f.kind] += 1
            out.append(f)
        return out

    def arm(self, f: Fault) -> str:
        """Arm a tool or sync fault that fired; returns its ``Fault`` row's detail."""
        if f.kind == "tool":
            self.hangs.append(f.trajectory)
            return f"tool: next tool call of {f.trajectory or 'any trajectory'} hangs (cut at {self.limit:g}s)"
        if f.kind != "sync":
            raise ValueError(f"LiveFaults.arm: a {f.kind!r} fault is not armed, it acts at once")
        if self.sync_fails:  # one armed failure at a time, or retries never end (as simulated)
            self.stats["without_effect"] += 1
            return "sync: a weight-sync failure is already armed: no effect"
        self.sync_fails = 1
        return f"sync: next weight sync fails (retried after {self.schedule.sync_retry_s:g}s)"

    def take_sync_failure(self) -> bool:
        """Whether the weight sync starting now fails (takes the armed failure)."""
        if not self.sync_fails:
            return False
        self.sync_fails -= 1
        return True

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

    def close(self, now: float) -> dict[str, Any]:
        """Totals for the run record, as the simulator writes them (``sim/faults.Faults.close``)."""
        stats = dict(self.stats)
        stats["failed_gpu_seconds"] += sum(now - t for t in self.fail_since.values())
        stats["retried_trajectories"] = len(self.hit)
        stats["armed_never_hit"] = (len(self.hangs) + self.sync_fails + self.trainer_armed
                                    + len(self.switching))  # armed, never hit
        return stats
