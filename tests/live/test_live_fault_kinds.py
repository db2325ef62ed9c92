"""Issue #22 item 4: ``[faults]`` of the sync, gpu and trainer kinds happen for real live.

One short live run per kind (the smallest config: two slots, one engine and one trainer
rank, two steps of four trajectories), each ending with every trajectory trained and
``lost_trajectories == 0``, and recording the events the simulator records for the same
schedule replayed on the trace the live run recorded:

* sync: the first weight sync fails for real (the engine receives the weights and refuses
  them), ``SyncFailed``, then the same engine is synced again after ``sync_retry_s``;
* gpu: the engine actor on GPU 0 is killed, its trajectories are interrupted and
  dispatched again once the GPU recovered (``WorkerFailed`` then ``WorkerRecovered``);
  the trainer GPU 1 fails: the trainer's rank is killed and it starts again once the GPU
  is back;
* trainer: the trainer's ranks are killed during its first job, ``TrainerFailed``, and the
  job is re-run on a trainer restarted from the last published weights.
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
KINDS = ["Fault", "WorkerFailed", "WorkerRecovered", "TrainerFailed", "SyncFailed"]


def _config(path: Path, cache: Path, faults: str) -> Path:
    path.write_text(
        "[cluster]\ngpus = 2\ntp = 1\n\n[run]\nsteps = 2\n\n"
        '[live]\ntasks = ["fix-clamp", "fix-last-item"]\ntasks_per_step = 2\nsamples_per_task = 2\n'
        "max_turns = 2\nmax_tokens_per_turn = 16\nkv_cache_mb = 64\ntool_seconds = 5.0\nmax_wall_s = 900.0\n"
        f"cache_dir = {json.dumps(str(cache))}\n\n{faults}"
    )
    return path


def _rlsched(*args: str) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).with_name("rlsched"))
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=1800)


def _kinds(ev: pd.DataFrame) -> list[str]:
    return ev.loc[ev["kind"].isin(KINDS), "kind"].tolist()


def _live(tmp_path: Path, cache: Path, faults: str, policy: str = POLICY):
    """Run live; return (record, run dir, config path) after the checks every kind shares."""
    from rlsched.analysis.load import check_record
    from rlsched.cluster.record import read_run

    cfg = _config(tmp_path / "live.toml", cache, faults)
    out = tmp_path / "live"
    res = _rlsched("run", "--live", "--policy", policy, "--config", str(cfg), "--out", str(out))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    [run_dir] = sorted((out / "runs").iterdir())
    rec = read_run(run_dir)
    check_record(rec)
    assert rec.meta["complete"] and rec.meta["faults"]["armed_never_hit"] == 0
    summary = pd.read_csv(out / "summary.csv")
    assert summary["lost_trajectories"][0] == 0 and summary["faults"][0] == 1
    assert set(rec.trajectories["status"]) == {"trained"}  # nothing lost, nothing dropped
    return rec, run_dir, cfg


def _simulated(tmp_path: Path, run_dir: Path, cfg: Path, name: str = "sim", policy: str = POLICY):
    """The simulator on the trace the live run recorded, with the same config."""
    from rlsched.cluster.record import read_run

    sim = tmp_path / name
    res = _rlsched("run", "--policy", policy, "--config", str(cfg), "--trace", str(run_dir / "trace.parquet"),
                   "--out", str(sim), "--model", "none")  # (2 logical GPUs: no trainer floor)
    assert res.returncode == 0, res.stderr[-2000:]
    [sim_dir] = sorted((sim / "runs").iterdir())
    assert pd.read_csv(sim / "summary.csv")["lost_trajectories"][0] == 0
    return read_run(sim_dir)


def _syncs(ev: pd.DataFrame) -> list[tuple[str, int]]:
    rows = ev[ev["kind"].isin(["SyncStart", "SyncFailed", "WeightsSynced"])]
    return list(zip(rows["kind"], rows["version"].astype(int), strict=True))


def test_a_failed_weight_sync_is_retried_and_nothing_is_lost(tiny_cache, tmp_path) -> None:
    # staleness 0: the second batch waits for the engine to hold version 1, which only the
    # retry gives it (the failed sync leaves it on version 0), so the run shows the retry
    policy = "async:rollout_fraction=0.5,staleness=0"
    retry = 2.0
    rec, run_dir, cfg = _live(tmp_path, tiny_cache, f"[faults]\nsync_retry_s = {retry}\n\n"
                                                    '[[faults.fault]]\nkind = "sync"\nat = 0.0\n', policy)
    m = rec.meta
    assert m["faults"]["sync"] == 1 and m["faults"]["sync_gpu_seconds_lost"] > 0
    ev = rec.events
    assert _kinds(ev) == ["Fault", "Fault", "SyncFailed"]
    [failed] = ev.loc[ev["kind"] == "SyncFailed"].itertuples()
    assert failed.version == 1 and failed.detail == f"0 retry {retry:g}s"
    # the failed sync gave the engine nothing; the same engine is synced again sync_retry_s later
    assert _syncs(ev) == [("SyncStart", 1), ("SyncFailed", 1), ("SyncStart", 1), ("WeightsSynced", 1)]
    retried = float(ev.loc[ev["kind"] == "SyncStart", "time"].iloc[1])
    synced = float(ev.loc[ev["kind"] == "WeightsSynced", "time"].iloc[0])
    assert retried >= failed.time + retry - 0.05
    dispatched = ev.loc[ev["kind"] == "Dispatch", "time"].tolist()
    assert len(dispatched) == 2 and dispatched[1] >= synced  # batch 1 waited for the retried sync
    notes = ev.loc[ev["kind"] == "Note", "detail"].tolist()
    assert not any("engine failed" in n for n in notes)  # the engine lived on, on its old weights
    sim = _simulated(tmp_path, run_dir, cfg, policy=policy)
    assert _kinds(sim.events) == _kinds(ev) and _syncs(sim.events) == _syncs(ev)
    print(f"\nlive sync fault: failed at {failed.time:.1f}s, retried at {retried:.1f}s, synced at {synced:.1f}s; "
          f"{m['faults']['sync_gpu_seconds_lost']:.2f} GPU-s lost")


def test_a_killed_engine_gpu_recovers_and_its_trajectories_resume(tiny_cache, tmp_path) -> None:
    recover = 3.0
    rec, run_dir, cfg = _live(tmp_path, tiny_cache, f"[faults]\nrecover_s = {recover}\n\n"
                                                    '[[faults.fault]]\nkind = "gpu"\nat = 0.0\ngpu = 0\n')
    m = rec.meta
    assert m["faults"]["gpu"] == 1 and m["faults"]["failed_gpu_seconds"] >= recover - 0.05
    ev = rec.events
    assert _kinds(ev) == ["Fault", "WorkerFailed", "WorkerRecovered"]
    [failed] = ev.loc[ev["kind"] == "WorkerFailed"].itertuples()
    [back] = ev.loc[ev["kind"] == "WorkerRecovered"].itertuples()
    assert failed.gpu == back.gpu == 0 and back.time >= failed.time + recover - 0.05
    hit = int(failed.detail.split()[0])
    assert hit > 0  # the engine was killed with trajectories on it (dispatched when it came up)
    assert hit == m["faults"]["trajectory_interruptions"] == m["faults"]["retried_trajectories"]
    interrupted = ev[(ev["kind"] == "TrajectoryFinished") & (ev["detail"] == "interrupted")]
    assert len(interrupted) >= hit
    assert (ev["kind"] == "EngineStart").sum() == 2  # a new engine on the recovered GPU
    sim = _simulated(tmp_path, run_dir, cfg)
    assert _kinds(sim.events) == _kinds(ev)
    print(f"\nlive gpu fault: engine killed at {failed.time:.1f}s with {hit} trajectories, "
          f"GPU back at {back.time:.1f}s, makespan {m['makespan_seconds']:.1f}s")


def test_a_failed_trainer_gpu_stops_the_trainer_until_it_recovers(tiny_cache, tmp_path) -> None:
    recover = 3.0
    rec, run_dir, cfg = _live(tmp_path, tiny_cache, f"[faults]\nrecover_s = {recover}\nrestart_s = 1.0\n\n"
                                                    '[[faults.fault]]\nkind = "gpu"\nat = 0.0\ngpu = 1\n')
    m = rec.meta
    assert m["faults"]["gpu"] == 1 and m["faults"]["failed_gpu_seconds"] >= recover - 0.05
    ev = rec.events
    assert _kinds(ev) == ["Fault", "WorkerFailed", "WorkerRecovered"]
    [fault] = ev.loc[ev["kind"] == "Fault", "detail"].tolist()
    assert fault.startswith("gpu: GPU 1 (train) failed: trainer shrinks to 0 GPUs, step re-run")
    [failed] = ev.loc[ev["kind"] == "WorkerFailed"].itertuples()
    assert failed.gpu == 1 and failed.detail == "0 trajectories interrupted"
    # the trainer's only rank was killed; it started again once the GPU was back
    actions = [r["action"] for r in m["measurements"]["trainer_membership"]]
    assert actions[:3] == ["start", "restart", "start"], actions
    assert list(rec.steps["version"]) == [1, 2]
    sim = _simulated(tmp_path, run_dir, cfg)
    assert _kinds(sim.events) == _kinds(ev)
    print(f"\nlive trainer-GPU fault: trainer lost GPU 1 at {failed.time:.1f}s, "
          f"makespan {m['makespan_seconds']:.1f}s")


def test_a_crashed_trainer_restarts_and_reruns_the_lost_job(tiny_cache, tmp_path) -> None:
    restart = 2.0
    rec, run_dir, _ = _live(tmp_path, tiny_cache, f"[faults]\nrestart_s = {restart}\n\n"
                                                  '[[faults.fault]]\nkind = "trainer"\nat = 0.0\n')
    m = rec.meta
    assert m["faults"]["trainer"] == 1 and m["faults"]["train_gpu_seconds_lost"] >= restart
    ev = rec.events
    assert _kinds(ev) == ["Fault", "TrainerFailed"]
    [crash] = ev.loc[ev["kind"] == "TrainerFailed"].itertuples()
    assert crash.version == 0 and crash.detail == f"restart {restart:g}s"
    restarts = [r for r in m["measurements"]["trainer_membership"] if r["action"] == "restart"]
    assert len(restarts) == 1 and restarts[0]["seconds"] >= restart
    # every micro-batch the policy asked for finished once the trainer was back
    asked = (ev["kind"].isin(["Train", "TrainMicroBatch"])).sum()
    assert (ev["kind"] == "MicroBatchFinished").sum() == asked and list(rec.steps["version"]) == [1, 2]
    assert ev.loc[ev["kind"] == "MicroBatchFinished", "time"].min() > crash.time
    # the simulator, with the fault at the time its trainer starts its first job (at t=0 its
    # trainer is still switching, where a trainer fault has no effect): the same events
    plain = _simulated(tmp_path, run_dir, _config(tmp_path / "plain.toml", tiny_cache, ""), "plain")
    first = float(plain.events.loc[plain.events["kind"].isin(["Train", "TrainMicroBatch"]), "time"].min())
    cfg2 = _config(tmp_path / "sim.toml", tiny_cache, f"[faults]\nrestart_s = {restart}\n\n"
                                                      f'[[faults.fault]]\nkind = "trainer"\nat = {first + 1e-6}\n')
    sim = _simulated(tmp_path, run_dir, cfg2)
    assert _kinds(sim.events) == _kinds(ev)
    print(f"\nlive trainer fault: crashed at {crash.time:.1f}s, restart took {restarts[0]['seconds']:.1f}s, "
          f"{m['faults']['train_gpu_seconds_lost']:.1f} GPU-s lost, makespan {m['makespan_seconds']:.1f}s")
