"""Issues #27 and #22 on the live backend, through the real command line:

* ``rlsched run --live`` writes the layout the simulated ``rlsched run`` writes
  (OUT/summary.csv with the same columns, OUT/runs/00-SPEC/ holding the record, OUT/report.html);
* ``--logger tensorboard`` streams each step's scalars to an event file that tensorboard's
  own reader reads back, at the run's versions;
* ``[run] sandbox_slots`` bounds the concurrent tool calls live as in the simulator;
* ``[run] processor`` is refused in one line before anything starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.live

POLICY = "async:rollout_fraction=0.5,staleness=1"


def _config(path: Path, cache: Path, *, extra_run: str = "") -> Path:
    path.write_text(
        "[cluster]\ngpus = 2\ntp = 1\n\n"
        f"[run]\nsteps = 2\nsandbox_slots = 1\n{extra_run}\n"
        '[live]\ntasks = ["fix-clamp", "fix-last-item"]\ntasks_per_step = 2\nsamples_per_task = 2\n'
        "max_turns = 2\nmax_tokens_per_turn = 16\nkv_cache_mb = 64\ntool_seconds = 5.0\nmax_wall_s = 900.0\n"
        f"cache_dir = {json.dumps(str(cache))}\n\n"
        '[logging]\nlogger = "none"\n'
    )
    return path


def _rlsched(*args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).with_name("rlsched"))
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)


def test_live_run_writes_the_simulated_layout_and_a_tensorboard_log(tiny_cache, tmp_path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rlsched.analysis.load import check_record
    from rlsched.cluster.record import read_run

    cfg = _config(tmp_path / "live.toml", tiny_cache)
    out, sim = tmp_path / "live", tmp_path / "sim"
    # --logger wins over the config's [logging] logger = "none"
    res = _rlsched("run", "--live", "--policy", POLICY, "--config", str(cfg), "--logger", "tensorboard",
                   "--out", str(out))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    res_sim = _rlsched("run", "--policy", POLICY, "--steps", "2", "--gpus", "2", "--tp", "1", "--out", str(sim),
                       "--model", "none")  # (2 logical GPUs: the flat model, no trainer floor)
    assert res_sim.returncode == 0, res_sim.stderr[-2000:]

    # one layout, with and without --live
    [run_dir] = sorted((out / "runs").iterdir())
    [sim_dir] = sorted((sim / "runs").iterdir())
    assert run_dir.name == sim_dir.name  # 00-<the spec as given>
    assert {"summary.csv", "report.html", "runs"} <= {p.name for p in out.iterdir()}
    # (a live run also has what it learned: the report's learning table)
    live_names, sim_names = {p.name for p in out.iterdir()}, {p.name for p in sim.iterdir()}
    assert live_names - sim_names == {"learning.csv"} and sim_names <= live_names
    live_sum, sim_sum = pd.read_csv(out / "summary.csv"), pd.read_csv(sim / "summary.csv")
    assert list(live_sum.columns) == list(sim_sum.columns)
    assert len(live_sum) == 1 and live_sum["policy"][0] == POLICY and live_sum["run_dir"][0] == f"runs/{run_dir.name}"
    assert live_sum["steps"][0] == 2 and live_sum["lost_trajectories"][0] == 0
    rec = read_run(run_dir)
    check_record(rec)
    assert rec.meta["driver"] == "live" and rec.meta["complete"]
    assert (run_dir / "trace.parquet").is_file() and (run_dir / "checkpoint" / "manifest.json").is_file()

    # sandbox_slots = 1: never two tool calls at once (SandboxQueued when one waited)
    meas = rec.meta["measurements"]
    assert rec.meta["sandbox_slots"] == 1 and meas["sandbox_peak"] == 1
    queued = int((rec.events["kind"] == "SandboxQueued").sum())
    assert queued == meas["sandbox_queued"]
    print(f"\nsandbox_slots=1: {queued} tool calls waited for the slot")

    # the TensorBoard log, read back by tensorboard's own reader
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("critic/score/mean", "actor/pg_loss", "perf/throughput", "timing_s/step",
                "rlsched/staleness/max", "rlsched/generated_tokens_per_s"):
        assert tag in tags, (tag, sorted(tags))
    assert any(t.startswith("rlsched/gpu_share/") for t in tags)
    assert [e.step for e in acc.Scalars("timing_s/step")] == [1, 2]
    steps = rec.steps.set_index("version")
    for e in acc.Scalars("perf/total_num_tokens"):
        assert e.value == steps.loc[e.step, "trained_tokens"]
    for e in acc.Scalars("rlsched/staleness/max"):
        assert e.value == steps.loc[e.step, "max_staleness"]
    assert rec.meta["logging"]["logger"] == ["tensorboard"]
    print({t: [round(e.value, 3) for e in acc.Scalars(t)] for t in sorted(tags)})


def test_rate_faults_are_refused_before_anything_starts(tiny_cache, tmp_path) -> None:
    # (`processor = true` is honoured live: tests/live/test_processor_live.py)
    cfg = _config(tmp_path / "live.toml", tiny_cache,
                  extra_run='\n[faults]\nfault = [{ kind = "tool", per_hour = 2.0 }]\n')
    res = _rlsched("run", "--live", "--policy", POLICY, "--config", str(cfg), "--out", str(tmp_path / "o"),
                   timeout=300)
    assert res.returncode == 2 and "[faults]" in res.stderr and "per_hour" in res.stderr, res.stderr
    assert res.stderr.strip().count("\n") == 0
    assert not (tmp_path / "o").exists()  # nothing left behind
