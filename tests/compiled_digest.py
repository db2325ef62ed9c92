"""Print a digest of simulator runs (tests/test_compiled.py runs it as pure Python and as
the compiled build and compares the two outputs): every shipped policy on the shipped
trace, with and without faults, down to each trajectory's finish time and token counts
and the recorded events and GPU intervals."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pandas as pd

from rlsched.cluster.config import RunConfig
from rlsched.cluster.faults import Fault, FaultSchedule
from rlsched.policies import available, make_policy
from rlsched.sim import compiled
from rlsched.sim.cost import CostModel
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload
from rlsched.traces import draw_batches, load_trace, sample_trace_path


def main() -> None:
    df = load_trace(sample_trace_path())
    batches = draw_batches(df, 3, tasks_per_step=8)
    w = Workload.from_frame(df)
    faults = FaultSchedule((Fault("gpu", per_hour=6.0), Fault("tool", per_hour=60.0),
                            Fault("trainer", per_hour=3.0)), seed=3)
    out: dict = {"compiled": list(compiled()), "runs": {}}
    tight = CostModel(gpu_mem_util=0.5)  # KV for ~5 of the 8 trajectories per engine
    runs = [(spec, fs, CostModel())
            for spec in [*available(), "async:rollout_fraction=0.5,staleness=1", "elastic:staleness=1"]
            for fs in (None, faults)]
    # (elastic's defaults never pack the tail, so its migrations are exercised by packing)
    runs += [(spec, None, tight) for spec in ("colocated", "elastic:staleness=1", "elastic:kv_limit=1")]
    for spec, fs, cost in runs:
        with tempfile.TemporaryDirectory() as d:
            res = simulate(w, batches, make_policy(spec), RunConfig(gpus=16, tp=2, steps=3, check=True),
                           cost, faults=fs, out_dir=Path(d), spec=spec)
            record = {name: pd.read_parquet(Path(d) / f"{name}.parquet").to_json(double_precision=15)
                      for name in ("intervals", "events")}
        r = res.result
        migrated = sum(1 for ts in r.state.trajs.values() if ts.migrations)
        out["runs"][f"{spec} faults={fs is not None} kv={cost.gpu_mem_util}"] = {
                "record": record, "makespan": r.makespan.hex(), "events": r.events_processed, "migrated": migrated,
            "gpu_seconds": {k: v.hex() for k, v in sorted(r.gpu_seconds.items())},
            "faults": {k: float(v).hex() for k, v in sorted(r.faults.items())},
            "trajs": [(tid, ts.status.name, ts.turns_done, ts.tokens, float(ts.finish_time).hex(),
                       r.trajs[tid].generated, r.trajs[tid].wasted)
                      for tid, ts in sorted(r.state.trajs.items())],
        }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
