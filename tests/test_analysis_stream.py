"""The one-pass reduction of a record's intervals (analysis/stream.py) against the
in-memory computations it replaces in the report: the same numbers, the same grid and the
same plot bytes, on the shipped trace's runs of every policy (with faults, the trajectory
processor and a saturated sandbox pool), read whole or a few rows at a time."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest_analysis import HAND_INTERVALS, write_run

from rlsched.analysis.breakdown import breakdown, bubbles, sandbox_windows
from rlsched.analysis.intervals import binned_grid, seconds_by_state, spans
from rlsched.analysis.load import load_run
from rlsched.analysis.metrics import summarize
from rlsched.analysis.report import _run_figures, stream_run
from rlsched.analysis.stream import summarize_intervals
from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import RecordError
from rlsched.cluster.faults import Fault, FaultSchedule
from rlsched.compare import ComparePlan, compare
from rlsched.policies import available
from rlsched.sim.cost import CostModel
from rlsched.traces import sample_trace_path

FAULTS = FaultSchedule((Fault("gpu", per_hour=6.0), Fault("tool", per_hour=60.0), Fault("trainer", per_hour=3.0)), seed=3)


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory) -> list[Path]:
    out = tmp_path_factory.mktemp("stream") / "cmp"
    specs = (*available(), "elastic:staleness=1")
    dirs = []
    for name, cfg in (
        ("plain", RunConfig(gpus=16, tp=2, steps=4, tasks_per_step=8, sandbox_slots=3)),
        ("faults", RunConfig(gpus=16, tp=2, steps=4, tasks_per_step=8, faults=FAULTS, processor=True)),
    ):
        compare(ComparePlan(sample_trace_path(), specs, cfg, CostModel()), out / name, report=False)
        dirs += sorted((out / name / "runs").iterdir())
    return dirs


def _streamed(rd: Path, batch_rows: int | None):
    head = load_run(rd, intervals=False)
    ws, we, _ = sandbox_windows(head)
    n, span = int(head.meta["num_gpus"]), float(head.meta["makespan_seconds"])
    return head, summarize_intervals(rd / "intervals.parquet", n, span, sandbox=(ws, we), batch_rows=batch_rows)


def _same(a: object, b: object) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("batch_rows", [None, 7, 1000])
def test_streamed_tables_equal_the_in_memory_ones(run_dirs, batch_rows):
    saturated = 0.0
    for rd in run_dirs:
        full = load_run(rd)
        head, st = _streamed(rd, batch_rows)
        assert st.rows == len(full.intervals)
        span = float(full.meta["makespan_seconds"])
        # bit-equal: summary.csv and the breakdown must not depend on how the record was read
        assert np.array_equal(st.seconds, seconds_by_state(spans(full.intervals, span)))
        old, new = summarize(full), summarize(head, st)
        assert list(old) == list(new)
        assert all(_same(old[k], new[k]) for k in old), rd
        pd.testing.assert_frame_equal(breakdown(full), breakdown(head, st), check_exact=True)
        saturated += st.saturated_tool_seconds
        ob, nb = bubbles(full), bubbles(head, st)
        for k in ("total_gpu_seconds", "mean_seconds"):  # summed in another order
            assert nb.pop(k) == pytest.approx(ob.pop(k), rel=1e-12, abs=1e-9), (rd, k)
        assert ob == nb, rd
        grid = binned_grid(spans(full.intervals, span), int(full.meta["num_gpus"]), span, max_rows=128, bins=800)
        assert np.array_equal(grid.seconds, st.grid.seconds), rd
    assert saturated > 0  # the sandbox-saturation path was exercised


def test_streamed_plots_are_the_same_bytes(run_dirs):
    for rd in run_dirs[:3] + run_dirs[-2:]:
        full = load_run(rd)
        head, st = stream_run(rd)
        assert _run_figures(full, "x") == _run_figures(head, "x", st)


def test_binned_timeline_from_the_stream_is_the_same_bytes(run_dirs, monkeypatch):
    # the shipped trace's records are small enough for exact rectangles; force the binned
    # timeline (what seed-scale records get) through both paths
    import rlsched.analysis.plots as plots
    import rlsched.analysis.stream as stream

    monkeypatch.setattr(plots, "EXACT_TIMELINE_MAX_INTERVALS", 0)
    monkeypatch.setattr(stream, "EXACT_SPANS_MAX", 0)
    rd = run_dirs[2]
    full = load_run(rd)
    head, st = _streamed(rd, 50)
    assert st.exact is None
    assert _run_figures(full, "x") == _run_figures(head, "x", st)


def test_rows_out_of_time_order_fall_back_to_the_in_memory_bubbles(tmp_path):
    d = write_run(tmp_path / "r", intervals=HAND_INTERVALS[::-1])
    full = load_run(d)
    head, st = _streamed(d, 2)
    assert bubbles(head, st) == bubbles(full)
    assert bubbles(full)["total_gpu_seconds"] == pytest.approx(11.0)  # GPU0 3 s + GPU1 8 s


def test_bad_rows_are_named_by_their_row_in_the_file(tmp_path):
    iv = [*HAND_INTERVALS[:5], (1, 4, 0.0, 1.0, "generate", -1), *HAND_INTERVALS[5:]]
    d = write_run(tmp_path / "r", intervals=iv)
    head = load_run(d, intervals=False)
    with pytest.raises(RecordError, match=r"intervals.parquet: row 5: GPUs 1..4 outside the cluster's 2 GPUs"):
        summarize_intervals(d / "intervals.parquet", 2, 10.0, batch_rows=2)
    with pytest.raises(RecordError, match=r"row 5: GPUs 1\.\.4"):  # the same line as the in-memory check
        load_run(d)
    assert head.intervals.empty
    d = write_run(tmp_path / "s")  # (RunRecorder refuses such a state: another tool wrote this one)
    pq.write_table(pa.table({
        "gpu_first": pa.array([0, 0, 1, 0], pa.int32()), "gpu_count": pa.array([1, 1, 1, 1], pa.int32()),
        "start": [0.0, 1.0, 0.0, 3.0], "end": [1.0, 2.0, 1.0, 4.0], "state": ["generate", "idle", "idle", "napping"],
        "step": pa.array([-1] * 4, pa.int32())}), d / "intervals.parquet")
    with pytest.raises(RecordError, match=r"row 3: state='napping': expected one of"):
        summarize_intervals(d / "intervals.parquet", 2, 10.0, batch_rows=2)
    (tmp_path / "s" / "intervals.parquet").write_bytes(b"not parquet")
    with pytest.raises(RecordError, match=r"intervals\.parquet: corrupt Parquet"):
        summarize_intervals(tmp_path / "s" / "intervals.parquet", 2, 10.0)


def test_summary_only_pass_skips_the_rest(run_dirs):
    rd = run_dirs[0]
    full = load_run(rd)
    st = summarize_intervals(rd / "intervals.parquet", int(full.meta["num_gpus"]),
                             float(full.meta["makespan_seconds"]), full=False)
    assert st.grid is None and st.bubbles is None
    assert np.array_equal(st.seconds, seconds_by_state(spans(full.intervals, float(full.meta["makespan_seconds"]))))


def _percentiles_by_full_sort(values, weights, qs):
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return [float(v) for v in values[order][np.searchsorted(cum, np.asarray(qs, dtype=float) / 100.0 * cum[-1])]]


@pytest.mark.parametrize("seed", range(6))
def test_bucketed_percentiles_equal_a_full_sort(seed):
    from rlsched.analysis.breakdown import _weighted_percentiles

    rng = np.random.default_rng(seed)
    values = rng.lognormal(1.0, 2.0, 150_000) + (0.0 if seed % 3 else 1.0)
    if seed % 2:
        values = np.round(values, seed % 3)  # many ties
    weights = rng.integers(1, 9, values.size)
    qs = (0, 1, 50, 90, 99, 100)
    assert _weighted_percentiles(values, weights, qs) == _percentiles_by_full_sort(values, weights, qs)


def test_summary_rows_equal_the_in_memory_summary(run_dirs):
    from rlsched.compare import summary_rows

    dirs = run_dirs[:4]
    got = summary_rows(["a", "b", "c", "d"], dirs)
    for i, rd in enumerate(dirs):
        want = {**summarize(load_run(rd)), "policy": "abcd"[i], "run_dir": f"runs/{rd.name}"}
        row = got.iloc[i].to_dict()
        assert list(row) == list(want)
        assert all(_same(row[k], want[k]) or row[k] == want[k] for k in want), rd
