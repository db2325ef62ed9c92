"""What holds each step back: a run's steps along their critical path.

The gap to the bound by cause (:mod:`.metrics`) shares the gap out in proportion to the
GPU-time each state lost. That says where GPU-time went, not what made the run longer: on
an on-policy run, trainer GPUs that wait for the tail are the largest lost GPU-time, yet
every step ends when its longest trajectory finishes and the little training left after it
is done -- giving those GPUs work would not end the step any sooner. This module reads the
steps the other way, along each step's link of the run's critical chain: from the moment its
batch could first roll out -- the end of step ``s-k-1``, which publishes the weights ``s-k``
that staleness ``k`` lets generate batch ``s`` (the run's start for the first ``k+1``) -- to
the end of its own optimizer step (the bound's step chain is made of these links):

* **start delay**: to the step's first dispatch (role switches back to rollout, weight
  syncs, a policy that releases its batch later);
* **longest solo**: the longest of the step's trajectories alone on an engine (batch 1,
  prefix cache hit, tools never queued: its solo time, a lower bound on its rollout from
  dispatch to finish), the part of the rollout no schedule avoids;
* **tail slowdown**: the rest of the rollout's span, from the first dispatch to the last
  finish -- the trajectories that end last running slower than alone, because they share
  an engine's decode with others, wait for KV or a slot, or were dispatched late;
* **after rollout**: from the last finish to the step's optimizer step ending (training
  not done while the step rolled out, the optimizer step).

The four sum to the link. With staleness 0 a link is the step's period (the previous
step's end to its own) and the links sum to the run; with staleness ``k`` a link spans
``k+1`` steps and the links cover the run about ``k+1`` times (the step's own period is
``period_s``). The staleness is the record's ``max_staleness_bound`` (the policy's
declared bound; 0 when absent). The solo times are the record's ``solo_seconds``
column (the simulator writes it from its cost model); a live run has none, and its rows
give the rollout's span whole (``rollout_s``) with the solo and slowdown parts NaN.
"""

from __future__ import annotations

import math

import pandas as pd

from rlsched.cluster.ids import TrajStatus
from rlsched.cluster.record import RunRecord

CRITICAL_COLUMNS: tuple[str, ...] = (
    "step", "start_delay_s", "rollout_s", "longest_solo_s", "tail_slowdown_s", "after_rollout_s",
    "link_s", "period_s", "weights_at", "start", "last_finish", "end", "last_trajectory",
)
# the parts summed over the steps, as summary.csv has them (analysis.metrics)
TOTAL_COLUMNS: dict[str, str] = {
    "start_delay_s": "steps_start_delay_s", "longest_solo_s": "steps_longest_solo_s",
    "tail_slowdown_s": "steps_tail_slowdown_s", "after_rollout_s": "steps_after_rollout_s",
}
_ROLLED = (TrajStatus.TRAINED.value, TrajStatus.DONE.value, TrajStatus.TIMED_OUT.value)


def critical_path(record: RunRecord) -> pd.DataFrame:
    """One row per trained step (``CRITICAL_COLUMNS``; seconds). The solo times are the
    record's ``solo_seconds``: without the column, or with a NaN among a step's
    trajectories, that step's longest solo and tail slowdown are NaN.

    A step's rollout is its trajectories that ran to their end (trained, done or timed out;
    dropped and stopped ones are left out). With a cut tail (a deferring policy trains it
    with a later step) a step's last trajectories may finish after the step ends: its
    after-rollout part is then 0."""
    t = record.trajectories
    steps = record.steps.sort_values("version")
    ends = pd.Series(steps["time"].astype(float).to_numpy(), index=steps["version"].astype(int).to_numpy() - 1)
    ran = t[t["status"].astype(str).isin(_ROLLED) & (t["dispatches"] > 0)
            & t["finish_time"].notna() & (t["finish_time"] >= 0) & t["step"].isin(ends.index)]
    solo = ran["solo_seconds"].astype(float) if "solo_seconds" in ran.columns else math.nan
    frame = pd.DataFrame({"step": ran["step"].astype(int), "start": ran["dispatch_time"].astype(float),
                          "finish": ran["finish_time"].astype(float), "solo": solo,
                          "id": ran["trajectory"].astype(str)})
    if frame.empty:
        return pd.DataFrame(columns=list(CRITICAL_COLUMNS))
    by = frame.groupby("step", sort=True)
    per = by.agg(start=("start", "min"), last_finish=("finish", "max"))
    per["longest"] = by["solo"].max(skipna=False)  # (one unknown solo: the step's is unknown)
    per["last_trajectory"] = frame.loc[by["finish"].idxmax(), "id"].to_numpy()
    k = record.meta.get("max_staleness_bound", 0)
    k = k if isinstance(k, int) and not isinstance(k, bool) and k >= 0 else 0
    per["end"] = ends.reindex(per.index)
    per["prev_end"] = ends.shift(1, fill_value=0.0).reindex(per.index)
    # (an end is known for every version a step reached: the steps table lists each once)
    per["weights_at"] = [float(ends.get(s - k - 1, 0.0)) for s in per.index]
    span = per["last_finish"] - per["start"]
    longest = per["longest"].where(per["longest"].isna(), per["longest"].clip(upper=span))
    out = pd.DataFrame({
        "step": per.index.astype(int),
        "start_delay_s": (per["start"] - per["weights_at"]).clip(lower=0.0),
        "rollout_s": span,
        # (clipped: float rounding; solo is a lower bound on the span. NaN stays NaN)
        "longest_solo_s": longest,
        "tail_slowdown_s": span - longest,
        "after_rollout_s": (per["end"] - per["last_finish"]).clip(lower=0.0),
        "link_s": per["end"] - per["weights_at"],
        "period_s": per["end"] - per["prev_end"],
        "weights_at": per["weights_at"],
        "start": per["start"],
        "last_finish": per["last_finish"],
        "end": per["end"],
        "last_trajectory": per["last_trajectory"],
    })
    return out.reset_index(drop=True)[list(CRITICAL_COLUMNS)]


def critical_totals(per_step: pd.DataFrame) -> dict[str, float]:
    """The parts and links summed over the steps (NaN if any step's is), and the periods'
    sum (the last step's end: the run's length when it trained every step)."""
    cols = ("start_delay_s", "rollout_s", "longest_solo_s", "tail_slowdown_s", "after_rollout_s", "link_s",
            "period_s")
    return {c: float(per_step[c].sum(skipna=False)) if len(per_step) else 0.0 for c in cols}


def summary_columns(record: RunRecord, per_step: pd.DataFrame | None = None) -> dict[str, float]:
    """``summary.csv``'s columns of this view (:data:`TOTAL_COLUMNS`): the parts summed
    over the steps (``per_step``: :func:`critical_path` of the record, if already made)."""
    tot = critical_totals(critical_path(record) if per_step is None else per_step)
    return {col: tot[part] for part, col in TOTAL_COLUMNS.items()}
