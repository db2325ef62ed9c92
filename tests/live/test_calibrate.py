"""``rlsched calibrate`` on the real live backend (vLLM engine, Megatron trainer lane,
weight reloads, role switches, sandboxed tools), with a small plan (about two minutes on
a 2-core host). Thresholds are structural or physical, not tuned numbers: the host is
shared, so timings vary run to run."""

from __future__ import annotations

import tomllib

import pytest

pytestmark = pytest.mark.live


def test_calibrate_measures_every_component_and_writes_a_loadable_file(tiny_cache, tmp_path):
    from rlsched.calibration import fit_measurements
    from rlsched.calibration_io import write_calibration
    from rlsched.cluster.config import RunConfig
    from rlsched.real.calibrate.bench import BenchPlan
    from rlsched.real.calibrate.run import calibrate
    from rlsched.real.config import LiveSettings
    from rlsched.sim.cost import CostModel

    plan = BenchPlan(decode_batches=(1, 8), decode_prompts=(32, 512), decode_tokens=8,
                     prefill_new=(16, 512), prefill_cached=(0, 512), train_shapes=((1, 128), (2, 512)),
                     sync_repeats=1, switch_rounds=1, tool_episodes=1, repeats=1)
    settings = LiveSettings.from_config({"cache_dir": str(tiny_cache), "kv_cache_mb": 32,
                                         "tasks": ["fix-clamp"]})
    result = fit_measurements(*calibrate(RunConfig(gpus=2, tp=1, steps=1), settings, plan=plan))
    rows = result.measurements
    for comp in ("decode", "prefill", "kv", "train", "optimizer", "sync", "switch", "tool"):
        assert (rows["component"] == comp).any(), comp
    decode = rows[rows["component"] == "decode"]
    assert set(decode["batch"].astype(int)) >= {1, 8}  # pure decode steps at both batch sizes
    prefill = rows[rows["component"] == "prefill"]
    assert (prefill["cached"] > 0).any()  # vLLM reported prefix-cache hits
    assert set(rows.loc[rows["component"] == "switch", "kind"]) == {"to_rollout", "to_train"}
    assert (rows.loc[rows["component"] == "train", "world"].astype(int).unique().size) == 2
    cost = result.calibration.cost
    kv = int(rows.loc[rows["component"] == "kv", "kv_capacity"].min())
    assert cost.kv_capacity_tokens(1) == kv > 0
    assert cost.layers == 2 and cost.bytes_per_param == 4.0  # the tiny float32 Llama
    path = write_calibration(tmp_path / "cost.toml", result)
    assert CostModel.from_file(path) == cost
    fit = tomllib.loads(path.read_text())["calibration"]["fit"]
    assert set(fit) == {"decode", "prefill", "kv_capacity", "train", "optimizer", "sync", "switch"}
