"""Interval arithmetic behind the plots, and the plots themselves (data in, axes out)."""

import numpy as np
import pandas as pd
import pytest
from conftest_analysis import HAND_INTERVALS, write_run
from matplotlib.axes import Axes
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from rlsched.analysis import plots
from rlsched.analysis.breakdown import breakdown
from rlsched.analysis.intervals import STATE_INDEX, grid, overlap, seconds_by_state, spans, union
from rlsched.analysis.load import load_run
from rlsched.analysis.metrics import staleness_table, step_times, summarize
from rlsched.analysis.style import STATE_COLORS, STATE_ORDER, png_bytes
from rlsched.cluster.ids import GpuState


def _iv(rows):
    return pd.DataFrame(rows, columns=["gpu_first", "gpu_count", "start", "end", "state", "step"])


def test_every_state_has_one_fixed_distinct_colour():
    assert set(STATE_ORDER) == {s.value for s in GpuState}
    assert set(STATE_COLORS) == set(STATE_ORDER)
    assert len(set(STATE_COLORS.values())) == len(STATE_COLORS)


def test_union_and_overlap():
    s, e = union(np.array([5.0, 0.0, 1.0, 8.0]), np.array([6.0, 2.0, 3.0, 9.0]))
    assert s.tolist() == [0.0, 5.0, 8.0] and e.tolist() == [3.0, 6.0, 9.0]
    got = overlap(np.array([0.0, 2.5, 5.5, 10.0]), np.array([10.0, 5.5, 8.5, 11.0]), s, e)
    assert got.tolist() == pytest.approx([5.0, 1.0, 1.0, 0.0])
    assert overlap(np.array([1.0]), np.array([2.0]), np.empty(0), np.empty(0)).tolist() == [0.0]


def test_grid_is_exact_per_cell():
    sp = spans(_iv(HAND_INTERVALS), 10.0)
    g = grid(sp, num_gpus=2, horizon=10.0, max_rows=1, bins=4)  # one row of 2 GPUs, 2.5 s bins
    assert g.gpus_per_row == 2 and g.seconds.shape == (1, len(STATE_ORDER), 4)
    gen = g.seconds[0, STATE_INDEX["generate"]]
    # generate: both GPUs 0-2, GPU0 2-5 -> bins [0,2.5)=4.5, [2.5,5)=2.5, rest 0
    assert gen.tolist() == pytest.approx([4.5, 2.5, 0.0, 0.0])
    assert g.seconds.sum(axis=(0, 2)) == pytest.approx(seconds_by_state(sp))
    assert g.cluster_fractions().sum(axis=0) == pytest.approx(np.ones(4))


def test_grid_splits_gpu_ranges_across_rows():
    # 10 GPUs in rows of 4: an interval over GPUs 2..8 lands 2, 4 and 3 GPUs in rows 0..2
    sp = spans(_iv([(2, 7, 0.0, 1.0, "train", 0)]), 1.0)
    g = grid(sp, num_gpus=10, horizon=1.0, max_rows=3, bins=1)
    assert g.gpus_per_row == 4 and g.row_gpus.tolist() == [4, 4, 2]
    assert g.seconds[:, STATE_INDEX["train"], 0].tolist() == pytest.approx([2.0, 4.0, 1.0])


def test_grid_long_intervals_fill_middle_bins():
    sp = spans(_iv([(0, 1, 0.25, 9.5, "generate", -1)]), 10.0)
    g = grid(sp, num_gpus=1, horizon=10.0, bins=10)
    assert g.seconds[0, STATE_INDEX["generate"]].tolist() == pytest.approx([0.75] + [1.0] * 8 + [0.5])


@pytest.fixture
def hand(tmp_path):
    return load_run(write_run(tmp_path / "hand"))


def _fill_colours(ax):
    out = set()
    for c in ax.collections:
        for fc in c.get_facecolors():
            out.add(to_hex(fc))
    for p in ax.patches:
        out.add(to_hex(p.get_facecolor()))
    return out


def test_timeline_exact_uses_state_colours(hand):
    ax = plots.plot_timeline(hand.intervals, 2, 10.0)
    assert isinstance(ax, Axes)
    # the hand record has every state but ``failed`` (no fault injection)
    assert _fill_colours(ax) == {STATE_COLORS[s].lower() for s in STATE_ORDER if s != "failed"}
    assert ax.get_title() and ax.get_xlabel() == "time (s)" and ax.get_legend() is not None


def test_timeline_binned_for_large_clusters():
    # 1024 GPUs: 256 engines of 4 alternating generate/tool_wait, then everyone trains
    rows = []
    for e in range(256):
        for k in range(20):
            rows.append((4 * e, 4, k * 10.0, k * 10.0 + 7, "generate", -1))
            rows.append((4 * e, 4, k * 10.0 + 7, k * 10.0 + 10, "tool_wait", -1))
    rows.append((0, 1024, 200.0, 300.0, "train", 0))
    ax = plots.plot_timeline(_iv(rows), 1024, 300.0, bins=300)
    img = ax.get_images()[0].get_array()
    assert img.shape == (128, 300)  # 8 GPUs per row
    assert (img[:, -50:] == STATE_INDEX["train"]).all()
    assert "8 GPUs per row" in ax.get_title()
    png_bytes(ax.figure)


def test_other_plots_draw_on_a_given_axes(hand):
    summary = pd.DataFrame([summarize(hand)])
    fig = Figure()
    axes = fig.subplots(2, 2)
    assert plots.plot_utilization(hand.intervals, 2, 10.0, ax=axes[0, 0]) is axes[0, 0]
    assert plots.plot_breakdown(breakdown(hand), summary, ax=axes[0, 1]) is axes[0, 1]
    assert plots.plot_step_times(step_times(hand), ax=axes[1, 0]) is axes[1, 0]
    assert plots.plot_staleness(staleness_table(hand), ax=axes[1, 1]) is axes[1, 1]
    # breakdown bars: the lower bound marker sits at 8 s
    marker = axes[0, 1].collections[-1].get_offsets()
    assert marker[0][0] == pytest.approx(8.0)
    assert png_bytes(fig).startswith(b"\x89PNG")


def test_length_cdfs():
    trace = pd.DataFrame({
        "trajectory_id": ["a", "a", "b"], "turn": [0, 1, 0], "prompt_tokens": [10, 5, 7],
        "output_tokens": [3, 4, 2], "env_seconds": [1.0, 0.0, 2.0],
    })
    lengths = plots.trajectory_lengths(trace)
    assert lengths.to_dict("list") == {"turns": [2, 1], "tokens": [22, 9], "output": [7, 2], "env_seconds": [1.0, 2.0]}
    axes = plots.plot_length_cdfs(lengths)
    assert len(axes) == 3 and all(a.get_xscale() == "log" for a in axes)


def test_spans_are_cached_only_inside_the_block():
    from rlsched.analysis import intervals as ivs

    df = _iv(HAND_INTERVALS)
    assert spans(df, 10.0) is not spans(df, 10.0)  # library calls (compare's summarize) keep nothing
    with ivs.cached():
        a = spans(df, 10.0)
        assert spans(df, 10.0) is a
        assert ivs.grid(a, 2, 10.0, bins=4) is ivs.grid(a, 2, 10.0, bins=4)
    assert not ivs._CACHE and not ivs._GRIDS
