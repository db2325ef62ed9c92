"""Issue #22 item 4: a ``[faults]`` tool fault happens for real on the live backend.

The first tool call after t=0 hangs: it holds its sandbox slot until it is cut at
``tool_timeout_s``, its trajectory continues with the timeout as the call's result, and the
run ends with every trajectory trained. The live record shows the events the simulator
records for the same schedule (replayed on the trace the live run recorded): a ``Fault``
when it fires, a ``Fault`` when the call hangs, ``ToolTimedOut`` when it is cut.
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
CUT = 4.0


def _config(path: Path, cache: Path) -> Path:
    path.write_text(
        "[cluster]\ngpus = 2\ntp = 1\n\n[run]\nsteps = 2\n\n"
        '[live]\ntasks = ["fix-clamp", "fix-last-item"]\ntasks_per_step = 2\nsamples_per_task = 2\n'
        "max_turns = 2\nmax_tokens_per_turn = 16\nkv_cache_mb = 64\ntool_seconds = 5.0\nmax_wall_s = 900.0\n"
        f"cache_dir = {json.dumps(str(cache))}\n\n"
        f"[faults]\ntool_timeout_s = {CUT}\n\n[[faults.fault]]\nkind = \"tool\"\nat = 0.0\n"
    )
    return path


def _rlsched(*args: str) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).with_name("rlsched"))
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=1800)


def _fault_events(ev: pd.DataFrame) -> list[tuple[str, str]]:
    """(kind, detail without the seconds lost) of the fault events, in order."""
    rows = ev[ev["kind"].isin(["Fault", "ToolTimedOut"])]
    return [(k, d.split(" (")[0]) for k, d in zip(rows["kind"], rows["detail"], strict=True)]


def test_a_hung_tool_call_is_cut_and_nothing_is_lost(tiny_cache, tmp_path) -> None:
    from rlsched.analysis.load import check_record
    from rlsched.cluster.record import read_run
    from rlsched.traces.load import load_trace

    cfg = _config(tmp_path / "live.toml", tiny_cache)
    out = tmp_path / "live"
    res = _rlsched("run", "--live", "--policy", POLICY, "--config", str(cfg), "--out", str(out))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    [run_dir] = sorted((out / "runs").iterdir())
    rec = read_run(run_dir)
    check_record(rec)
    m = rec.meta
    assert m["complete"] and m["faults"]["tool"] == 1 and m["faults"]["armed_never_hit"] == 0
    assert m["fault_schedule"]["tool_timeout_s"] == CUT
    summary = pd.read_csv(out / "summary.csv")
    assert summary["lost_trajectories"][0] == 0 and summary["faults"][0] == 1
    assert set(rec.trajectories["status"]) == {"trained"}

    ev = rec.events
    [hit] = ev.loc[ev["kind"] == "ToolTimedOut", "trajectory"].tolist()
    hung = ev[(ev["kind"] == "Fault") & (ev["trajectory"] == hit)]
    timed_out = ev[ev["kind"] == "ToolTimedOut"]
    waited = float(timed_out["time"].iloc[0] - hung["time"].iloc[0])
    assert waited >= CUT - 0.05  # the call really held its slot until the cut
    trace = load_trace(run_dir / "trace.parquet")
    assert (trace.loc[trace["trajectory_id"] == hit, "env_seconds"] >= CUT).any()  # recorded as the cut

    # the simulator, on the trace the live run recorded and the same schedule: same events
    sim = tmp_path / "sim"
    res_sim = _rlsched("run", "--policy", POLICY, "--config", str(cfg), "--trace", str(run_dir / "trace.parquet"),
                       "--out", str(sim), "--model", "none")  # (2 logical GPUs: no trainer floor)
    assert res_sim.returncode == 0, res_sim.stderr[-2000:]
    [sim_dir] = sorted((sim / "runs").iterdir())
    sim_rec = read_run(sim_dir)
    live_faults, sim_faults = _fault_events(ev), _fault_events(sim_rec.events)
    assert [k for k, _ in live_faults] == [k for k, _ in sim_faults] == ["Fault", "Fault", "ToolTimedOut"]
    assert live_faults[:2] == sim_faults[:2]  # the same detail text
    assert pd.read_csv(sim / "summary.csv")["lost_trajectories"][0] == 0
    print(f"\nlive: {hit}'s call hung {waited:.2f}s (cut at {CUT:g}s); events {live_faults}")
