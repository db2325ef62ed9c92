"""``run_live``: the elastic policy, unchanged from the simulator, runs on real engines,
a real trainer and the sandboxed coding environment, and writes a run record and trace
in the simulator's formats."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.live

LIVE = {
    "tasks": ["fix-clamp", "fix-average-empty", "fix-last-item"],
    "tasks_per_step": 2, "samples_per_task": 2, "max_turns": 3, "max_tokens_per_turn": 32,
    "kv_cache_mb": 64, "tool_seconds": 5.0, "max_wall_s": 600.0,
}


def _config(cache, **live):
    from rlsched.cluster.config import RunConfig

    return {"run": RunConfig(gpus=2, tp=1, steps=2), "live": {**LIVE, "cache_dir": str(cache), **live}}


def test_elastic_two_steps_live(tiny_cache, tmp_path) -> None:
    from rlsched.analysis.load import check_record
    from rlsched.cluster.record import read_run
    from rlsched.policies import make_policy_and_spec
    from rlsched.real.run import run_live
    from rlsched.traces.load import load_trace

    seen: list[int] = []
    # tail=1.0: consolidate as soon as one trajectory is done, so engines leave rollout
    # while others still run and their trajectories migrate.
    out = run_live("elastic:tail=1.0,pack=4", make=make_policy_and_spec, steps=2, out_dir=tmp_path / "run", config=_config(tiny_cache),
                   seed=0, progress=lambda done, n, t: seen.append(done))
    assert seen == [1, 2]
    rec = read_run(out)
    check_record(rec)
    m = rec.meta
    assert m["driver"] == "live" and m["complete"] and m["steps_done"] == 2
    assert m["policy"].startswith("elastic:") and m["num_gpus"] == 2
    tr = rec.trajectories
    assert len(tr) == 8
    assert set(tr["status"]) == {"trained"}  # nothing lost, nothing dropped
    assert (tr["trained_tokens"] > 0).all() and (tr["output_tokens"] > 0).all()
    assert list(rec.steps["version"]) == [1, 2]
    manifest = json.loads((out / "checkpoint" / "manifest.json").read_text())
    assert (manifest["version"], manifest["dir"]) == (2, "v0002")  # the last step is durable
    assert sorted(p.name for p in (out / "checkpoint").iterdir()) == ["manifest.json", "v0002"]
    kinds = rec.events["kind"]
    roles = rec.events.loc[kinds == "RolesChanged", "detail"].tolist()
    assert any(r.startswith("train") for r in roles) and any(r.startswith("rollout") for r in roles)
    assert (kinds == "EngineStop").any()  # a role change stopped a real engine actor
    # every GPU's intervals cover the run without gaps
    for _, iv in rec.intervals.groupby("gpu_first"):
        iv = iv.sort_values("start")
        assert iv["start"].iloc[0] == 0.0
        assert (iv["start"].to_numpy()[1:] == iv["end"].to_numpy()[:-1]).all()
        assert iv["end"].iloc[-1] == pytest.approx(m["makespan_seconds"])
    trace = load_trace(out / "trace.parquet")
    assert set(trace["trajectory_id"]) == set(tr["trajectory"])
    assert (trace.loc[trace["step"] == 1, "policy_version"] == 1).all()  # on-policy after the sync
    meas = m["measurements"]
    assert meas["engine_start_seconds"] and meas["optimizer_steps"]
    # issue #11: turns that became ready during a running engine call joined its batch
    # (before, two trajectories on one engine took turns: a mean batch of ~1)
    assert meas["engine_submits"] > 0
    assert meas["engine_batched_requests"] / meas["engine_iterations"] > 1.2
    print(f"\nlive elastic run: {m['makespan_seconds']:.0f}s, engine starts {meas['engine_start_seconds']}, "
          f"role switches {[round(s['seconds'], 1) for s in meas['role_switch']]}, sync {meas['sync']}")


def test_bad_model_path_leaves_nothing(tiny_cache, tmp_path) -> None:
    from rlsched.cluster.errors import LiveBackendError
    from rlsched.policies import make_policy_and_spec
    from rlsched.real.run import run_live

    out = tmp_path / "run"
    with pytest.raises(LiveBackendError, match="not a directory") as err:
        run_live("colocated", make=make_policy_and_spec, steps=1, out_dir=out, config=_config(tiny_cache, model=str(tmp_path / "nope")))
    assert "\n" not in str(err.value)
    assert not out.exists()


def test_unknown_live_key_is_a_config_error(tiny_cache, tmp_path) -> None:
    from rlsched.cluster.errors import ConfigError
    from rlsched.policies import make_policy_and_spec
    from rlsched.real.run import run_live

    with pytest.raises(ConfigError, match="did you mean 'max_turns'"):
        run_live("colocated", make=make_policy_and_spec, steps=1, out_dir=tmp_path / "run", config=_config(tiny_cache, max_turn=2))


def test_planned_cluster_config_runs_on_the_live_host(tiny_cache, tmp_path) -> None:
    """#10's promotion: a config shaped like ``rlsched plan``'s ``recommended.toml`` -- the
    planned 64-GPU cluster in ``[cluster]``, the live host in ``[live]``, policies tuned
    for 64 GPUs -- runs as written with ``run --config X --live --steps 2`` (no --policy:
    the first ``[[policy]]``). A rollout fraction of 0.375 of two slots still keeps one
    engine on each side."""
    import subprocess
    import sys
    from pathlib import Path

    from rlsched.analysis.load import check_record
    from rlsched.cluster.record import read_run

    cfg = tmp_path / "recommended.toml"
    cfg.write_text(
        "[cluster]\ngpus = 64\ntp = 4\n\n[run]\nsteps = 8\ntasks_per_step = 16\nsamples_per_task = 8\n\n"
        "[live]\ngpus = 2\ntp = 1\ntasks = [\"fix-clamp\", \"fix-last-item\"]\ntasks_per_step = 2\n"
        "samples_per_task = 2\nmax_turns = 2\nmax_tokens_per_turn = 16\nkv_cache_mb = 64\ntool_seconds = 5.0\n"
        f"max_wall_s = 900.0\ncache_dir = {json.dumps(str(tiny_cache))}\n\n"
        "[[policy]]\nspec = \"async:rollout_fraction=0.375,staleness=1\"  # recommended\n\n"
        "[[policy]]\nspec = \"elastic:staleness=1,min_engines=4\"  # for comparison\n"
    )
    out = tmp_path / "run"
    rlsched = str(Path(sys.executable).with_name("rlsched"))
    res = subprocess.run([rlsched, "run", "--config", str(cfg), "--live", "--steps", "2", "--out", str(out)],
                         capture_output=True, text=True, timeout=1500)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    # the layout of a simulated `rlsched run`: the record under runs/, named by the spec run
    assert (out / "summary.csv").is_file() and (out / "report.html").is_file()
    rec = read_run(out / "runs" / "00-async_rollout_fraction=0.375_staleness=1")
    check_record(rec)
    m = rec.meta
    assert m["complete"] and m["steps_done"] == 2 and m["num_gpus"] == 2 and m["tp"] == 1
    assert m["policy"].startswith("async:")
    assert len(rec.trajectories) == 8 and set(rec.trajectories["status"]) == {"trained"}
    roles = rec.events.loc[rec.events["kind"] == "RolesChanged", "detail"].tolist()
    assert "rollout 0" in roles and "train 1" in roles  # one engine each side of the split
