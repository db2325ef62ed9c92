"""Per-run metrics from a run record: the ``summary.csv`` row and the tables behind it.

Everything is read from the record (meta.json and its Parquet tables), never from a
driver, so simulated and live runs are measured the same way.

Definitions (the report and summary.csv use exactly these):

* **busy** GPU-time is time in ``generate`` or ``train``; ``gpu_utilization`` = busy
  GPU-seconds / (``num_gpus`` x makespan), over ``[0, makespan]``.
* ``idle_fraction`` = share of GPU-time holding no work at all (``rollout_idle``,
  ``train_idle``, ``idle``); ``1 - gpu_utilization - idle_fraction`` is then the time
  spent in tool waits, weight syncs, role switches and, with fault injection, failed
  (``failed``: down, not idle by choice; its total is ``failed_gpu_seconds``).
* **staleness** of a trained trajectory = ``trained_version - min_version`` (its oldest
  kept token's weights vs. the trainer's at train time).
* **lost** trajectories: dispatched trajectories that should have ended trained or dropped
  but did not. In a complete run that is every dispatched trajectory neither trained nor
  dropped (the simulator's invariant: it must be 0). In an incomplete run (stopped early)
  trajectories of steps still in progress are in flight, not lost; only those of steps
  whose optimizer step already ran that finished generating (done, timed out, failed) and
  were never trained, dropped or carried over count. *Carried over* means resumable or
  resumed: status ``interrupted`` or dispatched more than once (partial rollout resumes a
  trajectory with a later step's batch). ``unfinished_trajectories`` counts everything
  neither trained nor dropped, in flight or not.
* **saved** tokens (trajectory processor): kept context tokens of trained trajectories
  minus the tokens the trainer was charged for; 0 when the processor did not run.
* **faults** (fault injection, ``[faults]``; all 0 for a run without a fault schedule,
  read from ``meta.json["faults"]`` which the simulator writes):
  ``faults`` = faults fired; ``retried_trajectories`` = distinct trajectories a fault
  stopped and that had to be dispatched again (each must still end trained or dropped:
  ``lost_trajectories`` stays 0); ``fault_wasted_tokens`` = generated tokens of the turns
  in progress that faults threw away (also in ``wasted_tokens``);
  ``fault_gpu_seconds_lost`` = GPU-seconds of work faults made useless -- trainer work
  re-run after a trainer or trainer-GPU failure, trainer GPUs waiting for its restart, and
  failed weight syncs (decode is counted in tokens, above); ``failed_gpu_seconds`` =
  GPU-seconds GPUs spent failed; ``fault_tool_seconds_lost`` = tool-call seconds hung
  calls added (cut at ``tool_timeout_s``). The time a fault costs the run as a whole is
  the difference in ``sim_seconds`` against the same run without faults
  (``bench/bench_faults.py`` prints it).
* **gap to the bound by cause** (seconds; ``gap_seconds`` = ``sim_seconds`` -
  ``lower_bound_seconds``), attributed in proportion to the GPU-time each cause lost
  (GPU-seconds per GPU): ``gap_tail_s`` (rollout GPUs holding no generating sequence --
  ``tool_wait``, ``rollout_idle`` -- and unassigned ``idle`` GPUs: the long tail and
  waiting for work), ``gap_trainer_wait_s`` (``train_idle``: trainer GPUs with nothing to
  train), ``gap_switch_s`` (``switch``), ``gap_sync_s`` (``sync``) and ``gap_other_s``
  (busy and failed GPU-seconds per GPU beyond the whole bound: decode at batches below
  ``max_num_seqs``, repeated prefill, faults; 0 when the bound is the critical path). The
  five sum to ``gap_seconds``. The GPU-time lost per cause without the attribution is
  ``state_seconds`` (the report's breakdown). NaN without a bound.
* **what holds the steps back** (:mod:`.critical`; seconds summed over the steps, each
  step from the previous one's end to its own): ``steps_start_delay_s`` (to the step's
  first dispatch), ``steps_longest_solo_s`` (each step's longest trajectory alone on an
  engine: what no schedule avoids), ``steps_tail_slowdown_s`` (the rest of each rollout's
  span: its last trajectories slower than alone), ``steps_after_rollout_s`` (from each
  step's last finish to its optimizer step's end). On-policy they sum to the run; with
  staleness steps overlap and they sum to more. The solo parts are NaN for a live run (its
  record has no cost model's solo times).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from rlsched.cluster.ids import GpuState, TrajStatus
from rlsched.cluster.record import RunRecord

from .critical import summary_columns as critical_columns
from .intervals import STATE_INDEX, seconds_by_state, spans
from .load import check_record, event_counts

if TYPE_CHECKING:
    from .stream import IntervalSummary

# summary.csv: a public contract. Columns are only ever added, never renamed or removed --
# with one exception: ``wall_seconds`` (host time, between ``saved_tokens`` and
# ``events_processed``) left it so that two replays of one run give the same file; the
# compare's ``timing.csv`` has it (issue 27).
SUMMARY_COLUMNS: tuple[str, ...] = (
    "policy", "steps", "sim_seconds", "trained_tokens", "gpu_utilization", "max_staleness",
    "lost_trajectories", "lower_bound_seconds",
    "steps_per_hour", "trained_tokens_per_gpu_hour", "gap_to_bound_pct", "idle_fraction",
    "dropped_trajectories", "wasted_tokens", "saved_tokens", "events_processed",
    "unfinished_trajectories", "complete", "driver", "num_gpus",
    "faults", "retried_trajectories", "fault_wasted_tokens", "fault_gpu_seconds_lost",
    "failed_gpu_seconds", "fault_tool_seconds_lost",
    "gap_seconds", "gap_tail_s", "gap_trainer_wait_s", "gap_switch_s", "gap_sync_s", "gap_other_s",
    "steps_start_delay_s", "steps_longest_solo_s", "steps_tail_slowdown_s", "steps_after_rollout_s",
)
# the causes of the gap to the bound (see the module doc), by GpuState
GAP_CAUSES: dict[str, tuple[str, ...]] = {
    "gap_tail_s": (GpuState.TOOL_WAIT.value, GpuState.ROLLOUT_IDLE.value, GpuState.IDLE.value),
    "gap_trainer_wait_s": (GpuState.TRAIN_IDLE.value,),
    "gap_switch_s": (GpuState.SWITCH.value,),
    "gap_sync_s": (GpuState.SYNC.value,),
}
BUSY = (GpuState.GENERATE.value, GpuState.TRAIN.value)
NO_WORK = (GpuState.ROLLOUT_IDLE.value, GpuState.TRAIN_IDLE.value, GpuState.IDLE.value)
_TERMINAL = (TrajStatus.TRAINED.value, TrajStatus.DROPPED.value)
_FINISHED_UNTRAINED = (TrajStatus.DONE.value, TrajStatus.TIMED_OUT.value, TrajStatus.FAILED.value)


def makespan(record: RunRecord) -> float:
    return float(record.meta["makespan_seconds"])


def label(record: RunRecord) -> str:
    """The policy as the user wrote it (compare keeps it in ``spec_as_given``)."""
    given = record.meta.get("spec_as_given")
    return str(given) if isinstance(given, str) and given else str(record.meta["policy"])


def steps_done(record: RunRecord) -> int:
    v = record.meta.get("steps_done")
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    return len(record.steps)


def state_seconds(record: RunRecord, streamed: IntervalSummary | None = None) -> pd.Series:
    """GPU-seconds per GpuState over ``[0, makespan]`` (all states, zeros included); from
    ``streamed`` (the intervals reduced in one pass) when given, else the frame in memory."""
    if streamed is not None:
        secs = streamed.seconds
    else:
        secs = seconds_by_state(spans(record.intervals, makespan(record)))
    return pd.Series(secs, index=list(STATE_INDEX), name="gpu_seconds")


def staleness(record: RunRecord) -> pd.Series:
    """Staleness of each trained trajectory (indexed like the trajectories table)."""
    t = record.trajectories
    trained = (t["status"].astype(str) == TrajStatus.TRAINED.value) & (t["min_version"] >= 0)
    return (t["trained_version"] - t["min_version"])[trained].astype(np.int64)


def lost_mask(record: RunRecord) -> pd.Series:
    """Which trajectories are lost (see the module doc for the definition)."""
    t = record.trajectories
    status = t["status"].astype(str)
    dispatched = t["dispatches"] > 0
    open_ = ~status.isin(_TERMINAL)
    if bool(record.meta.get("complete", False)):
        limit = int(record.meta.get("num_steps", np.iinfo(np.int32).max))
        return dispatched & open_ & (t["step"] < limit)
    carried = (status == TrajStatus.INTERRUPTED.value) | (t["dispatches"] > 1)
    return dispatched & status.isin(_FINISHED_UNTRAINED) & ~carried & (t["step"] < steps_done(record))


def saved_tokens(record: RunRecord) -> int:
    t = record.trajectories
    trained = t["status"].astype(str) == TrajStatus.TRAINED.value
    config = record.meta.get("config") or {}
    if not (isinstance(config, dict) and config.get("processor")):
        return 0
    kept = (t["prompt_tokens"] + t["output_tokens"])[trained].sum()
    return int(kept - t["trained_tokens"][trained].sum())


def _finite_or_nan(v: Any) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else math.nan


def summarize(record: RunRecord, streamed: IntervalSummary | None = None) -> dict[str, Any]:
    """One ``summary.csv`` row for the run (columns: :data:`SUMMARY_COLUMNS`); ``streamed``
    as for :func:`state_seconds`. Every value is a function of the record's contents, so
    replaying the same run gives the same row, byte for byte (host time is not in it)."""
    check_record(record)
    meta = record.meta
    span = makespan(record)
    gpus = int(meta["num_gpus"])
    secs = state_seconds(record, streamed)
    total = gpus * span
    busy = float(secs[list(BUSY)].sum())
    t = record.trajectories
    status = t["status"].astype(str)
    stale = staleness(record)
    trained_tokens = int(t["trained_tokens"].sum())
    steps = steps_done(record)
    lb = _finite_or_nan(meta.get("lower_bound_seconds"))
    hours = span / 3600.0
    row: dict[str, Any] = {
        "policy": label(record),
        "steps": steps,
        "sim_seconds": span,
        "trained_tokens": trained_tokens,
        "gpu_utilization": busy / total if total > 0 else math.nan,
        "max_staleness": int(stale.max()) if len(stale) else 0,
        "lost_trajectories": int(lost_mask(record).sum()),
        "lower_bound_seconds": lb,
        "steps_per_hour": steps / hours if hours > 0 else math.nan,
        "trained_tokens_per_gpu_hour": trained_tokens / (gpus * hours) if hours > 0 else math.nan,
        "gap_to_bound_pct": (span / lb - 1.0) * 100.0 if lb > 0 else math.nan,
        "idle_fraction": float(secs[list(NO_WORK)].sum()) / total if total > 0 else math.nan,
        "dropped_trajectories": int((status == TrajStatus.DROPPED.value).sum()),
        "wasted_tokens": int(t["wasted_tokens"].sum()),
        "saved_tokens": saved_tokens(record),
        "events_processed": int(meta["events_processed"]) if isinstance(meta.get("events_processed"), int) else -1,
        "unfinished_trajectories": int((~status.isin(_TERMINAL)).sum()),
        "complete": bool(meta.get("complete", False)),
        "driver": str(meta.get("driver", "")),
        "num_gpus": gpus,
        **fault_columns(meta),
        **gap_columns(secs, gpus, span, lb),
        **critical_columns(record),
    }
    return row


def gap_columns(secs: pd.Series, gpus: int, span: float, lb: float) -> dict[str, float]:
    """The gap to the bound split by cause (see the module doc); NaN without a bound."""
    if not (lb > 0 and gpus > 0):
        return {"gap_seconds": math.nan, **dict.fromkeys(GAP_CAUSES, math.nan), "gap_other_s": math.nan}
    gap = span - lb
    lost = {col: float(secs[list(states)].sum()) / gpus for col, states in GAP_CAUSES.items()}
    accounted = sum(lost.values())
    lost["gap_other_s"] = max(0.0, span - accounted - lb)  # (busy + failed per GPU, beyond lb)
    total = sum(lost.values())
    share = gap / total if total > 0 else 0.0
    return {"gap_seconds": gap, **{col: v * share for col, v in lost.items()}}


def fault_columns(meta: dict[str, Any]) -> dict[str, Any]:
    """The fault columns of summary.csv from ``meta["faults"]`` (see the module doc)."""
    f = meta.get("faults")
    f = f if isinstance(f, dict) else {}

    def num(key: str) -> float:
        v = f.get(key, 0)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else 0.0

    return {
        "faults": int(num("faults")),
        "retried_trajectories": int(num("retried_trajectories")),
        "fault_wasted_tokens": int(num("wasted_tokens")),
        "fault_gpu_seconds_lost": num("train_gpu_seconds_lost") + num("sync_gpu_seconds_lost"),
        "failed_gpu_seconds": num("failed_gpu_seconds"),
        "fault_tool_seconds_lost": num("tool_seconds_lost"),
    }


def staleness_table(record: RunRecord) -> pd.DataFrame:
    """Distribution of staleness over trained trajectories: count, share, tokens."""
    t = record.trajectories
    stale = staleness(record)
    df = pd.DataFrame({"staleness": stale.to_numpy(), "tokens": t["trained_tokens"].loc[stale.index].to_numpy()})
    out = df.groupby("staleness", as_index=False).agg(trajectories=("tokens", "size"), trained_tokens=("tokens", "sum"))
    out["fraction"] = out["trajectories"] / max(len(df), 1)
    out.insert(0, "policy", label(record))
    return out


def waste_table(record: RunRecord) -> dict[str, Any]:
    """What staleness control and preemption cost: discarded, re-run and moved work."""
    t = record.trajectories
    status = t["status"].astype(str)
    counts = event_counts(record)
    fin = t["finish_status"].astype(str) if "finish_status" in t else pd.Series("", index=t.index)
    return {
        "policy": label(record),
        "trajectories": len(t),
        "trained": int((status == TrajStatus.TRAINED.value).sum()),
        "dropped": int((status == TrajStatus.DROPPED.value).sum()),
        "timed_out": int((fin == TrajStatus.TIMED_OUT.value).sum()),
        "interrupted_then_resumed": int((t["dispatches"] > 1).sum()),
        "resumes": int((t["dispatches"] - 1).clip(lower=0).sum()),
        "migrations": int(t["migrations"].sum()),
        "evictions": counts.get("Evict", 0),
        "sandbox_queued": counts.get("SandboxQueued", 0),
        "wasted_tokens": int(t["wasted_tokens"].sum()),
        "dropped_tokens": int(t["output_tokens"][status == TrajStatus.DROPPED.value].sum()),
        "saved_tokens": saved_tokens(record),
    }


def step_times(record: RunRecord) -> pd.DataFrame:
    """Wall time of each optimizer step (time between consecutive step ends).

    Steps are numbered from 0 like the trajectories' ``step`` (step ``s`` makes version
    ``s + 1``)."""
    s = record.steps.sort_values("version")
    end = s["time"].to_numpy(dtype=np.float64)
    dur = np.diff(end, prepend=0.0)
    step = s["version"].to_numpy() - 1
    return pd.DataFrame({"policy": label(record), "step": step, "end": end, "seconds": dur})


def length_bias(record: RunRecord) -> pd.DataFrame:
    """Are short trajectories trained first? Per step: the trace length (turns) of the
    trajectories trained in that optimizer step vs. of the step's whole batch.

    ``bias_pct`` > 0: trained ones were longer than the batch; < 0: shorter, the bias that
    hurts learning on long-horizon tasks when a policy trains whatever finished first.
    """
    t = record.trajectories
    status = t["status"].astype(str)
    batch = t.groupby("step")["turns_total"].agg(batch_trajectories="size", batch_mean_turns="mean")
    tr = t[status == TrajStatus.TRAINED.value]
    trained = tr.groupby("trained_version")["turns_total"].agg(
        trained_trajectories="size", trained_mean_turns="mean",
        trained_p90_turns=lambda x: float(np.percentile(x, 90)),
    )
    trained.index.name = "step"
    out = batch.join(trained, how="outer").reset_index()
    out["bias_pct"] = (out["trained_mean_turns"] / out["batch_mean_turns"] - 1.0) * 100.0
    out.insert(0, "policy", label(record))
    return out
