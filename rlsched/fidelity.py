"""``rlsched fidelity``: replay a live run in the simulator and compare the two.

The live run record holds everything a replay needs: the policy spec, the run config, the
live settings (tasks and samples per step, concurrent tool calls) and ``trace.parquet``
(every turn's tokens and measured tool seconds, with its ``step``). The replay runs the same
policy on the same steps under a given cost model; :mod:`rlsched.analysis.fidelity`
compares the records. This module joins the simulator and the analysis, which never
import each other's drivers.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlsched.analysis.fidelity import (
    FidelityResult,
    check_repeat,
    compare_runs,
    live_record,
    repeat_record,
    write_tables,
)
from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import ConfigError, RecordError
from rlsched.cluster.record import RunRecord, read_run
from rlsched.compare import prepare_out_dir, publish


def replay_config(meta: dict[str, Any], source: Path) -> RunConfig:
    """The simulator's RunConfig for a live run: its [cluster]/[run] values, with the
    live-only settings that the simulator models mapped onto its own fields."""
    where = source / "meta.json"
    cfg = meta.get("config")
    live = meta.get("live") or {}
    if not isinstance(cfg, dict):
        raise RecordError(f"{where}: no 'config' table; not a run record rlsched wrote")
    if not isinstance(live, dict):
        raise RecordError(f"{where}: field live={live!r}: expected a table")
    known = set(RunConfig.__dataclass_fields__)
    kw = {k: v for k, v in cfg.items() if k in known}
    kw["tasks_per_step"] = live.get("tasks_per_step", kw.get("tasks_per_step"))
    kw["samples_per_task"] = live.get("samples_per_task", kw.get("samples_per_task"))
    if "env_workers" in live:
        kw["sandbox_slots"] = _whole(live["env_workers"], "live.env_workers", where)  # concurrent tool calls
    kw["steps"] = _whole(meta.get("steps_done") or kw.get("steps", 1), "steps_done", where)
    kw["check"] = False
    try:
        return RunConfig(**kw)
    except ConfigError as exc:  # (its message names the field; this names the file too)
        raise RecordError(f"{where}: {exc}") from None


def _whole(value: Any, name: str, where: Path) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or int(value) != value:
        raise RecordError(f"{where}: field {name}={value!r}: expected a whole number")
    return int(value)


def replay(live: RunRecord, cost: Any, out_dir: Path) -> RunRecord:
    """Simulate the live run's trace with its policy and config under ``cost``."""
    from rlsched.policies import make_policy
    from rlsched.sim.run import simulate
    from rlsched.sim.workload import Workload
    from rlsched.traces import draw_batches, load_trace
    from rlsched.traces.digest import trace_location, trace_meta

    trace_path = live.path / str(live.meta["trace"])
    df = load_trace(trace_path)
    config = replay_config(live.meta, live.path)
    batches = draw_batches(df, config.steps, config.tasks_per_step, config.samples_per_task)
    spec = str(live.meta["policy"])
    simulate(Workload.from_frame(df), batches, make_policy(spec), config, cost, out_dir=out_dir,
             spec=spec, meta={**trace_location(trace_path), **trace_meta(trace_path), "spec_as_given": spec,
                              "replay_of": str(live.path)})
    return read_run(out_dir)


def fidelity(live_dir: Path, cost: Any, out_dir: Path, *, force: bool = False,
             repeat: Path | None = None, inputs: Sequence[Path] = ()) -> FidelityResult:
    """Replay ``live_dir`` under ``cost``; write ``out_dir``/fidelity.csv and the replay
    (``out_dir/sim``). Like ``compare``, it writes into a temporary sibling that replaces
    ``out_dir`` only when everything succeeded."""
    live = live_record(Path(live_dir))
    rep = repeat_record(repeat) if repeat is not None else None
    if rep is not None:
        check_repeat(live, rep)  # (before the replay, not after it)
    out = Path(out_dir)
    tmp = prepare_out_dir(out, force, inputs=(live_dir, *((repeat,) if repeat is not None else ()), *inputs))
    try:
        result = compare_runs(live, replay(live, cost, tmp / "sim"), rep)
        write_tables(result, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish(tmp, out)
    return result
