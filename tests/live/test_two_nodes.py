"""Issue #25, item 4 -- a live run on a Ray cluster of two nodes started on this machine
(``ray start --head`` plus ``ray start --address`` on the loopback address, each node with
its own logical GPU slot): workers are placed on both nodes and the run completes, weight
sync included (weights travel through the object store, not a shared process)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.live

PORT = 6391


def _ray(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "ray"
    return subprocess.run([str(exe if exe.is_file() else shutil.which("ray") or "ray"), *args],
                          capture_output=True, text=True, timeout=180)


@pytest.fixture
def two_nodes():
    common = ["--num-cpus=1", "--object-store-memory=200000000", "--disable-usage-stats"]
    head = _ray("start", "--head", f"--port={PORT}", "--node-ip-address=127.0.0.1", "--include-dashboard=false",
                '--resources={"slot_0": 1}', *common)
    try:
        assert head.returncode == 0, head.stderr[-800:]
        worker = _ray("start", f"--address=127.0.0.1:{PORT}", "--node-ip-address=127.0.0.1",
                      '--resources={"slot_1": 1}', *common)
        assert worker.returncode == 0, worker.stderr[-800:]
        yield f"127.0.0.1:{PORT}"
    finally:
        _ray("stop", "--force")


def test_live_run_spans_two_ray_nodes(two_nodes, tiny_cache, tmp_path, monkeypatch) -> None:
    import pandas as pd

    from rlsched.cluster.config import RunConfig
    from rlsched.policies import make_policy_and_spec
    from rlsched.real.loop import ray_cluster
    from rlsched.real.run import run_live

    monkeypatch.setenv(ray_cluster.ADDRESS_ENV, two_nodes)
    ray_cluster.start_cluster(2)
    nodes = ray_cluster.slot_nodes()
    ray_cluster.stop_cluster()
    assert set(nodes) == {0, 1} and nodes[0] != nodes[1], nodes  # one slot on each node

    live = {"env": "lookup", "tasks_per_step": 2, "samples_per_task": 2, "max_turns": 2,
            "max_tokens_per_turn": 12, "kv_cache_mb": 64, "max_wall_s": 900.0, "cache_dir": str(tiny_cache)}
    out = tmp_path / "two-nodes"
    # async: one engine and one trainer rank at a time, so both nodes hold a worker at once,
    # and a weight sync after every step crosses from the trainer's node to the engine's
    run_live("async:staleness=1", make=make_policy_and_spec, steps=3, out_dir=out,
             config={"run": RunConfig(gpus=2, tp=1, steps=3), "live": live}, seed=0)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["complete"] and meta["steps_done"] == 3
    iv = pd.read_parquet(out / "intervals.parquet")
    busy = iv[iv["state"].isin(["generate", "train"])]
    assert set(busy["gpu_first"]) == {0, 1}, "both nodes' slots must have worked"
    assert len(meta["measurements"]["sync"]) >= 2  # weights synced to the other node's engine
