"""Hand-built run records for the analysis tests, written with the real RunRecorder.

``HAND`` is a 2-GPU, 10-second run whose every number is computed by hand below, so the
tests can demand exact GPU-seconds per state and cause, exact bubbles and staleness.

Timeline (G = generate, T = tool_wait, R = rollout_idle, S = sync, W = switch,
X = train, Y = train_idle, I = idle)::

    t     0 1 2 3 4 5 6 7 8 9 10
    GPU0  G G G G G T R S X X       (G 0-2 recorded as one 2-GPU interval)
    GPU1  G G R R T T W Y Y I

* generate 4 + 3 = 7; tool_wait 1 + 2 = 3; rollout_idle 1 + 2 = 3; sync 1; switch 1;
  train 2; train_idle 2; idle 1; total 20 GPU-s.
* GPU1's rollout_idle 2-4 is while GPU0 generates: long tail 2 s. GPU0's rollout_idle
  6-7: GPU1 is switching, nobody holds work: no rollout work 1 s.
* Sandbox: one call queued 4.5 .. 5.5: tool_wait overlapping it is GPU0 0.5 + GPU1 1.0.
* Busy = 9 GPU-s: utilization 0.45; no-work states 3 + 2 + 1 = 6: idle_fraction 0.3.
* Bubbles: GPU0 [5, 8) 3 s; GPU1 [2, 10) 8 s.
* Staleness of trained trajectories: a 0, b 1, c 2 (max 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from rlsched.cluster.record import RunRecorder

HAND_INTERVALS = [
    (0, 2, 0.0, 2.0, "generate", -1),
    (0, 1, 2.0, 5.0, "generate", -1),
    (0, 1, 5.0, 6.0, "tool_wait", -1),
    (0, 1, 6.0, 7.0, "rollout_idle", -1),
    (0, 1, 7.0, 8.0, "sync", -1),
    (0, 1, 8.0, 10.0, "train", 1),
    (1, 1, 2.0, 4.0, "rollout_idle", -1),
    (1, 1, 4.0, 6.0, "tool_wait", -1),
    (1, 1, 6.0, 7.0, "switch", -1),
    (1, 1, 7.0, 9.0, "train_idle", -1),
    (1, 1, 9.0, 10.0, "idle", -1),
]
HAND_EVENTS = [
    (0.0, "RunStarted", {}),
    (4.5, "SandboxQueued", {"trajectory": "b"}),
    (5.5, "SandboxAcquired", {"trajectory": "b"}),
    (7.0, "SyncStart", {"version": 1}),
    (8.0, "SyncEnd", {"version": 1}),
    (8.5, "Evict", {"trajectory": "c", "engine": 0}),
    (9.0, "Evict", {"trajectory": "c", "engine": 0}),
]
TRAJ_COLUMNS = [
    "trajectory", "task_id", "step", "status", "finish_status", "dispatch_time", "finish_time",
    "trained_version", "min_version", "max_version", "turns_total", "turns_done", "prompt_tokens",
    "output_tokens", "trained_tokens", "wasted_tokens", "dispatches", "migrations",
]
#              id   task step status      finish     disp fin  tv mnv mxv tt td  pr  out  trn  wst d  m
HAND_TRAJS = [
    ("a", "t0", 0, "trained", "done", 0.0, 4.0, 0, 0, 0, 2, 2, 10, 20, 30, 0, 1, 0),
    ("b", "t0", 0, "trained", "done", 0.0, 6.0, 1, 0, 1, 4, 4, 20, 40, 60, 5, 2, 1),
    ("c", "t1", 1, "trained", "timed_out", 1.0, 9.0, 2, 0, 1, 6, 3, 30, 60, 90, 0, 1, 0),
    ("d", "t1", 1, "dropped", "done", 1.0, 9.0, -1, 1, 1, 8, 8, 40, 80, 0, 80, 1, 0),
]
HAND_STEPS = [(1, 5.0, 2, 90, 1.0, 1), (2, 10.0, 1, 90, 2.0, 2)]
STEP_COLUMNS = ["version", "time", "trajectories", "trained_tokens", "train_seconds", "max_staleness"]


def hand_meta(**over: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "driver": "sim", "policy": "hand:k=2", "policy_name": "hand", "num_gpus": 2, "tp": 1,
        "num_steps": 2, "steps_done": 2, "complete": True, "makespan_seconds": 10.0,
        "lower_bound_seconds": 8.0, "max_staleness_bound": 2, "seed": 0,
        "config": {"gpus": 2, "tp": 1, "steps": 2, "processor": False},
        "cost_model": {"switch_s": 1.0, "sync_latency_s": 0.5},
        "wall_seconds": 0.25, "events_processed": 123,
    }
    meta.update(over)
    return meta


def write_run(
    path: Path,
    *,
    intervals: list[tuple] | None = None,
    events: list[tuple] | None = None,
    trajectories: list[tuple] | None = None,
    steps: list[tuple] | None = None,
    **meta: Any,
) -> Path:
    """Write a run record with RunRecorder; every part defaults to the HAND run's."""
    rec = RunRecorder(path)
    for ev_time, kind, kw in HAND_EVENTS if events is None else events:
        rec.event(ev_time, kind, **kw)
    for iv in HAND_INTERVALS if intervals is None else intervals:
        rec.interval(*iv)
    trajs = pd.DataFrame(HAND_TRAJS if trajectories is None else trajectories, columns=TRAJ_COLUMNS)
    st = pd.DataFrame(HAND_STEPS if steps is None else steps, columns=STEP_COLUMNS)
    rec.close(trajs, st, hand_meta(**meta))
    return path
