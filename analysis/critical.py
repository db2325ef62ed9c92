"""What holds each step back: a run's steps along their critical path.

The gap to the bound by cause (:mod:`.metrics`) shares the gap out in proportion to the
GPU-time each state lost. That says where GPU-time went, not what made the run longer: on
an on-policy run, trainer GPUs that wait for the tail are the largest lost GPU-time, yet
every step ends when its longest trajectory finishes and the little training left after it
is done -- giving those GPUs work would not end the step any sooner. This module reads the
steps the other way, along the time each step takes:

* **start delay**: from the previous step's end to the step's first dispatch (role switches
  back to rollout, weight syncs, a policy's wait);
* **longest solo**: the longest of the step's trajectories alone on an engine (batch 1,
  prefix cache hit, tools never queued: its solo time, a lower bound on its rollout from
  dispatch to finish), the part of the rollout no schedule avoids;
* **tail slowdown**: the rest of the rollout's span, from the first dispatch to the last
  finish -- the trajectories that end last running slower than alone, because they share
  an engine's decode with others, wait for KV or a slot, or were dispatched late;
* **after rollout**: from the last finish to the step's optimizer step ending (training
  not done while the step rolled out, the optimizer step).

With staleness 0 the four sum to the step's period (end to end). With staleness the next
steps roll out while a step trains, so a step's rollout can start before the previous
step's end (start delay 0) and the four overlap from step to step; each still says what
that step's rollout and training took. The solo times come from the caller (the cost
model's, ``rlsched.sim.bound.turn_solo_seconds``): a record holds no cost model.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from rlsched.cluster.ids import TrajStatus
from rlsched.cluster.record import RunRecord

CRITICAL_COLUMNS: tuple[str, ...] = (
    "step", "start_delay_s", "longest_solo_s", "tail_slowdown_s", "after_rollout_s",
    "period_s", "start", "last_finish", "end", "last_trajectory",
)
_ROLLED = (TrajStatus.TRAINED.value, TrajStatus.DONE.value, TrajStatus.TIMED_OUT.value)


def critical_path(record: RunRecord, solo_s: Mapping[str, float]) -> pd.DataFrame:
    """One row per trained step (``CRITICAL_COLUMNS``; seconds). ``solo_s``: each
    trajectory's solo seconds over the turns it kept, by trajectory id (a trajectory
    missing from it counts as 0 s, so its step's tail slowdown is an upper figure).

    A step's rollout is its trajectories that ended on their own or at their limit (trained,
    done, timed out); one cut or dropped is left out of its span (a deferring policy trains
    it with a later step)."""
    t = record.trajectories
    steps = record.steps.sort_values("version")
    ends = dict(zip(steps["version"].astype(int) - 1, steps["time"].astype(float), strict=True))
    rolled = t[t["status"].astype(str).isin(_ROLLED) & (t["dispatches"] > 0)
               & t["finish_time"].notna() & (t["finish_time"] >= 0)]
    rows = []
    prev_end = 0.0
    for s in sorted(ends):
        end = ends[s]
        g = rolled[rolled["step"] == s]
        if g.empty:
            prev_end = end
            continue
        start = float(g["dispatch_time"].min())
        last_i = g["finish_time"].idxmax()
        last = float(g["finish_time"][last_i])
        longest = max(float(solo_s.get(str(x), 0.0)) for x in g["trajectory"])
        span = last - start
        longest = min(longest, span)  # (float rounding: solo is a lower bound on the span)
        rows.append({
            "step": s,
            "start_delay_s": max(0.0, start - prev_end),
            "longest_solo_s": longest,
            "tail_slowdown_s": span - longest,
            "after_rollout_s": max(0.0, end - last),
            "period_s": end - prev_end,
            "start": start,
            "last_finish": last,
            "end": end,
            "last_trajectory": str(g["trajectory"][last_i]),
        })
        prev_end = end
    return pd.DataFrame(rows, columns=list(CRITICAL_COLUMNS))


def critical_totals(per_step: pd.DataFrame) -> dict[str, float]:
    """The four parts summed over the steps, and the periods' sum (the run's length, from
    the first step's start, when the run is on-policy)."""
    cols = ("start_delay_s", "longest_solo_s", "tail_slowdown_s", "after_rollout_s", "period_s")
    return {c: float(per_step[c].sum()) if len(per_step) else 0.0 for c in cols}
