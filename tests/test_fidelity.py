"""``rlsched fidelity`` logic on a *fake* live run: a simulator run record relabelled as
live (``meta.driver = "live"`` plus the live settings and trace a live run writes). With
the cost model that made it, the replay must match it exactly; with another one it must
not -- so the comparison can fail. The real live path is in tests/live."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from rlsched.analysis.fidelity import event_order
from rlsched.analysis.fidelity_report import write_fidelity_report
from rlsched.cli import main
from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import ConfigError, RecordError
from rlsched.fidelity import fidelity, replay_config
from rlsched.policies import make_policy
from rlsched.sim.cost import CostModel
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload
from rlsched.traces import draw_batches, load_trace
from rlsched.traces.load import write_trace

COST = replace(CostModel(), switch_s=15.0, sync_latency_s=0.3, optimizer_step_s=0.1)


def tiny_live_trace(path: Path, steps: int = 3) -> Path:
    rows = []
    for s in range(steps):
        for task in ("a", "b"):
            for j in range(2):
                tid = f"s{s}-{task}-{j}"
                for turn in range(3):
                    rows.append({"task_id": f"{task}{s}", "trajectory_id": tid, "turn": turn,
                                 "prompt_tokens": 300 if turn == 0 else 60, "output_tokens": 32,
                                 "env_seconds": 0.05 + 0.3 * (turn == 2) + 0.1 * j, "reward": 0.0,
                                 "truncated": False, "step": s, "policy_version": s})
    return write_trace(pd.DataFrame(rows), path)


def fake_live_run(d: Path, policy: str = "colocated", cost: CostModel = COST, seed: int = 0) -> Path:
    """A simulated run dressed as a live one (the fields fidelity reads)."""
    d.mkdir(parents=True)
    trace = tiny_live_trace(d / "trace.parquet")
    df = load_trace(trace)
    config = RunConfig(gpus=2, tp=1, steps=3, tasks_per_step=2, samples_per_task=2, sandbox_slots=8, seed=seed)
    batches = draw_batches(df, 3, 2, 2)
    live = {"tasks_per_step": 2, "samples_per_task": 2, "env_workers": 8}
    simulate(Workload.from_frame(df), batches, make_policy(policy), config, cost, out_dir=d,
             spec=policy, meta={"driver": "live", "live": live, "trace": "trace.parquet"})
    return d


def test_replay_under_the_generating_cost_matches_exactly(tmp_path):
    live = fake_live_run(tmp_path / "live")
    r = fidelity(live, COST, tmp_path / "fid")
    assert list(r.steps["step"]) == [0, 1, 2]
    assert r.steps["abs_error_pct"].max() < 1e-6
    assert r.summary["order_identical"]
    got = pd.read_csv(tmp_path / "fid" / "fidelity.csv")
    assert {"step", "live_seconds", "sim_seconds", "abs_error_pct"} <= set(got.columns)


def test_replay_under_another_cost_shows_the_error(tmp_path):
    live = fake_live_run(tmp_path / "live")
    r = fidelity(live, replace(COST, switch_s=30.0), tmp_path / "fid")
    assert r.summary["median_abs_error_pct"] > 20.0
    assert (r.steps["sim_seconds"] > r.steps["live_seconds"]).all()


def test_repeat_gives_the_spread_and_the_report_has_both_timelines(tmp_path):
    a = fake_live_run(tmp_path / "a")
    b = fake_live_run(tmp_path / "b", cost=replace(COST, switch_s=16.0))
    r = fidelity(a, COST, tmp_path / "fid", repeat=b)
    assert r.summary["spread_median_pct"] > 0
    assert "spread_pct" in r.steps
    page = write_fidelity_report(r, tmp_path / "fid").read_text()
    assert "live above, simulated below" in page and page.count("<img") >= 2


def test_order_reflects_role_changes_and_syncs(tmp_path):
    live = fake_live_run(tmp_path / "live", policy="async")
    r = fidelity(live, COST, tmp_path / "fid")
    order = event_order(r.sim)
    assert any(x.startswith("sync:") for x in order) and any(x.startswith("roles:") for x in order)


def test_replay_config_maps_live_settings():
    meta = {"config": {"gpus": 2, "tp": 1, "steps": 5, "seed": 3}, "steps_done": 4,
            "live": {"tasks_per_step": 3, "samples_per_task": 2, "env_workers": 6}}
    cfg = replay_config(meta, Path("run"))
    assert (cfg.steps, cfg.tasks_per_step, cfg.samples_per_task, cfg.sandbox_slots, cfg.seed) == (4, 3, 2, 6, 3)


@pytest.mark.parametrize(("edit", "needle"), [
    ({"live": {"env_workers": "abc"}}, r"field live.env_workers='abc': expected a whole number"),
    ({"steps_done": "x"}, r"field steps_done='x': expected a whole number"),
    ({"live": [1, 2]}, r"field live=\[1, 2\]: expected a table"),
    ({"config": {"gpus": "many", "tp": 1}}, r"meta.json: run config: gpus='many'"),
])
def test_an_edited_live_meta_is_one_line_naming_it(edit, needle):
    """Each was a ValueError or AttributeError traceback, or a line without the file."""
    meta = {"config": {"gpus": 2, "tp": 1, "steps": 5, "seed": 3}, "steps_done": 4,
            "live": {"tasks_per_step": 3, "samples_per_task": 2, "env_workers": 6}, **edit}
    with pytest.raises(RecordError, match=needle):
        replay_config(meta, Path("run"))


def test_a_simulated_run_is_refused_in_one_line(tmp_path):
    d = fake_live_run(tmp_path / "live")
    meta = json.loads((d / "meta.json").read_text())
    meta["driver"] = "sim"
    (d / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(RecordError, match="fidelity needs a live run"):
        fidelity(d, COST, tmp_path / "fid")


def test_non_empty_out_needs_force(tmp_path):
    live = fake_live_run(tmp_path / "live")
    (tmp_path / "fid").mkdir()
    (tmp_path / "fid" / "x").write_text("x")
    with pytest.raises(ConfigError, match="not empty"):
        fidelity(live, COST, tmp_path / "fid")


def test_cli_end_to_end(tmp_path, capsys):
    live = fake_live_run(tmp_path / "live")
    cost = tmp_path / "cost.toml"
    cost.write_text("[cost]\n" + "\n".join(f"{k} = {getattr(COST, k)!r}" for k in
                                           ("switch_s", "sync_latency_s", "optimizer_step_s")) + "\n")
    assert main(["fidelity", str(live), "--cost", str(cost), "--out", str(tmp_path / "fid")]) == 0
    assert "median per-step error 0.0%" in capsys.readouterr().err
    assert main(["fidelity", str(tmp_path / "nope"), "--out", str(tmp_path / "f2")]) == 2
