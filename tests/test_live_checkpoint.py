"""The live backend's checkpoint bookkeeping and ``[live]`` host keys, without Ray or vLLM:
what a resume accepts and refuses (one line each), the manifest's atomic hand-over between
steps, and the in-memory recorder that writes a readable record at any step."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import ConfigError
from rlsched.cluster.record import read_run
from rlsched.real.config import LiveSettings
from rlsched.real.loop import checkpoint
from rlsched.real.record.recorder import MemoryRecorder

STEP_COLS = ["version", "time", "trajectories", "trained_tokens", "train_seconds", "max_staleness"]


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_live_gpus_override_cluster_for_live_runs_only() -> None:
    planned = RunConfig(gpus=64, tp=4)
    assert LiveSettings.from_config({}).cluster(planned.gpus, planned.tp) == (64, 4)
    assert LiveSettings.from_config({"gpus": 2, "tp": 1}).cluster(64, 4) == (2, 1)
    assert LiveSettings.from_config({"gpus": 8}).cluster(64, 4) == (8, 4)
    with pytest.raises(ConfigError) as err:  # the planned tp does not fit the live slots
        LiveSettings.from_config({"gpus": 2}).cluster(64, 4)
    assert "set [live] tp = 1" in _one_line(err)
    with pytest.raises(ConfigError, match=r"\[live\] gpus=-1"):
        LiveSettings.from_config({"gpus": -1})
    with pytest.raises(ConfigError, match="expected an integer"):
        LiveSettings.from_config({"tp": "1"})


def test_recorder_shifts_versions_and_writes_a_readable_record(tmp_path) -> None:
    rec = MemoryRecorder(base=3)
    rec.event(1.0, "TrainStepFinished", step=0, version=1)
    rec.event(1.5, "Note", detail="x")
    rec.interval(0, 1, 0.0, 2.0, "train", step=0)
    rec.interval(1, 1, 0.0, 2.0, "idle")
    steps = pd.DataFrame([[4, 1.0, 0, 0, 0.5, 0]], columns=STEP_COLS)
    rec.write(tmp_path, pd.DataFrame({"trajectory": pd.Series([], dtype=str)}), steps,
              {"driver": "live", "policy": "colocated", "num_gpus": 2})
    r = read_run(tmp_path)
    assert r.events[["step", "version"]].values.tolist() == [[3, 4], [-1, -1]]
    assert r.intervals["step"].tolist() == [3, -1]
    assert not list(tmp_path.glob(".record-tmp"))
    again = MemoryRecorder(base=3, events=r.events, intervals=r.intervals)  # a resume's start
    assert again.ev["version"] == [4, -1] and len(again.iv["start"]) == 2


def _fake_run(out, version: int, num_steps: int, fp: dict, policy: str = "colocated") -> None:
    d = checkpoint.step_dir(out, version)
    d.mkdir(parents=True)
    (d / "trainer.pt").write_bytes(b"weights")
    MemoryRecorder().write(d, pd.DataFrame({"trajectory": ["a"], "status": ["trained"]}),
                           pd.DataFrame(columns=STEP_COLS), {"driver": "live", "policy": policy})
    checkpoint.save(out, version, policy=policy, num_steps=num_steps, fp=fp, config={}, time=12.5)


def _fp(**live) -> dict:
    settings = LiveSettings.from_config(live)
    return checkpoint.fingerprint(RunConfig(gpus=2, tp=1, steps=3), settings, 2, 1)


def test_manifest_moves_to_the_newest_step_and_drops_older_ones(tmp_path) -> None:
    _fake_run(tmp_path, 1, 3, _fp())
    newer = checkpoint.step_dir(tmp_path, 3)
    newer.mkdir()  # the trainer already filling a later step: left alone
    d2 = checkpoint.step_dir(tmp_path, 2)
    d2.mkdir()
    (d2 / "trainer.pt").write_bytes(b"w2")
    MemoryRecorder().write(d2, pd.DataFrame({"trajectory": ["a"], "status": ["trained"]}),
                           pd.DataFrame(columns=STEP_COLS), {"driver": "live", "policy": "colocated"})
    checkpoint.save(tmp_path, 2, policy="colocated", num_steps=3, fp=_fp(), config={}, time=20.0)
    m = checkpoint.read_manifest(tmp_path)
    assert (m["version"], m["dir"]) == (2, "v0002")
    assert not checkpoint.step_dir(tmp_path, 1).exists() and newer.exists()
    r = checkpoint.load(tmp_path, m, policy="colocated", fp=_fp())
    assert (r.version, r.time, r.settled_ids()) == (2, 20.0, {"a"})
    assert not newer.exists()  # a resume clears what the killed run left half-written


def test_resume_refusals_are_one_line(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no such run directory"):
        checkpoint.read_manifest(tmp_path / "nope")
    with pytest.raises(ConfigError) as err:
        checkpoint.read_manifest(tmp_path)
    assert "no checkpoint" in _one_line(err)
    sim = tmp_path / "sim"
    sim.mkdir()
    (sim / "meta.json").write_text(json.dumps({"format": "rlsched-run", "driver": "sim"}))
    with pytest.raises(ConfigError) as err:
        checkpoint.read_manifest(sim)
    assert "a sim run, not a live run" in _one_line(err)

    run = tmp_path / "live"
    _fake_run(run, 1, 3, _fp(max_turns=3))
    m = checkpoint.read_manifest(run)
    with pytest.raises(ConfigError) as err:
        checkpoint.load(run, m, policy="elastic", fp=_fp(max_turns=3))
    assert "policy is 'colocated', not 'elastic'" in _one_line(err)
    with pytest.raises(ConfigError) as err:
        checkpoint.load(run, m, policy="colocated", fp=_fp(max_turns=2))
    assert "[live] max_turns is 2, the run has 3" in _one_line(err)
    # operational keys may differ: a resume may get more wall time
    checkpoint.load(run, m, policy="colocated", fp=_fp(max_turns=3, max_wall_s=60.0))

    done = tmp_path / "done"
    _fake_run(done, 3, 3, _fp())
    with pytest.raises(ConfigError) as err:
        checkpoint.load(done, checkpoint.read_manifest(done), policy="colocated", fp=_fp())
    assert "complete (3 of 3 steps trained)" in _one_line(err)
