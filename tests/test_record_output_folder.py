"""A command that reads one run accepts the output folder ``rlsched run`` wrote (the run's
record lies under ``runs/``, with and without ``--live``); a folder of several runs is
refused in one line that names them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import RecordError
from rlsched.cluster.record import read_run
from rlsched.compare import ComparePlan, compare
from rlsched.sim.cost import CostModel
from rlsched.traces import sample_trace_path


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cmp") / "out"
    cfg = RunConfig(gpus=8, tp=2, steps=1, tasks_per_step=2)
    compare(ComparePlan(sample_trace_path(), ("colocated", "async"), cfg, CostModel()), out, report=False)
    return out


def test_output_folder_of_one_run_reads_that_run(two_runs: Path, tmp_path: Path) -> None:
    one = tmp_path / "one"
    (one / "runs").mkdir(parents=True)
    shutil.copytree(two_runs / "runs" / "00-colocated", one / "runs" / "00-colocated")
    rec = read_run(one)
    assert rec.path == one / "runs" / "00-colocated"
    assert rec.meta["policy"] == read_run(two_runs / "runs" / "00-colocated").meta["policy"]


def test_output_folder_of_several_runs_is_refused_naming_them(two_runs: Path) -> None:
    with pytest.raises(RecordError, match=r"holds 2 run records .*00-colocated.*01-async.*name one"):
        read_run(two_runs)
