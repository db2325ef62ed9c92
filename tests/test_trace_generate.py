"""Synthetic traces: determinism, the shipped sample, presets and their long tails."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

from rlsched.cluster.errors import ConfigError
from rlsched.traces import (
    PRESETS,
    GenParams,
    generate_trace,
    load_trace,
    sample_trace_path,
    trace_stats,
    validate_trace,
)


def test_shipped_sample_is_what_the_generator_makes():
    """The file in traces/data/ never drifts from generate_trace('longtail-small', seed=0)."""
    path = sample_trace_path()
    assert path.stat().st_size < 5 * 1024 * 1024
    pd.testing.assert_frame_equal(load_trace(path), generate_trace("longtail-small", seed=0))


def test_same_seed_same_rows_other_seed_other_rows():
    a = generate_trace("longtail-small", seed=3, tasks=8)
    b = generate_trace("longtail-small", seed=3, tasks=8)
    c = generate_trace("longtail-small", seed=4, tasks=8)
    pd.testing.assert_frame_equal(a, b)
    assert not a["output_tokens"].equals(c["output_tokens"])


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_already_canonical(name):
    df = generate_trace(name, seed=1, tasks=16)
    pd.testing.assert_frame_equal(validate_trace(df, name), df)
    assert df["trajectory_id"].nunique() == 16 * PRESETS[name].samples


def test_forks_copy_their_parents_shared_turns():
    df = generate_trace("longtail-small", seed=2, tasks=32, branch_frac=0.6)
    kids = df[df["parent_trajectory_id"].notna()]
    assert kids["trajectory_id"].nunique() > 40
    by_id = {tid: g.reset_index(drop=True) for tid, g in df.groupby("trajectory_id")}
    order = {tid: i for i, tid in enumerate(df["trajectory_id"].unique())}
    for tid, g in kids.groupby("trajectory_id"):
        parent, b = g["parent_trajectory_id"].iloc[0], int(g["branch_turn"].iloc[0])
        assert order[parent] < order[tid]  # parents come first in the file
        assert g["task_id"].iloc[0] == by_id[parent]["task_id"].iloc[0]
        cols = ["prompt_tokens", "output_tokens", "env_seconds"]
        mine = by_id[tid].loc[: b - 1, cols].reset_index(drop=True)
        theirs = by_id[parent].loc[: b - 1, cols].reset_index(drop=True)
        pd.testing.assert_frame_equal(mine, theirs)


def test_uniform_preset_is_uniform():
    stats = trace_stats(generate_trace("uniform", seed=0))
    for metric in ("turns_per_trajectory", "context_tokens_per_trajectory",
                   "env_seconds_per_trajectory"):
        row = stats.loc[metric]
        assert row["p50"] == row["max"] == row["mean"]
    assert stats.loc["branched", "count"] == 0
    assert stats.loc["truncated", "count"] == 0


def test_limits_truncate_and_keep_finished_turns():
    df = generate_trace("longtail-small", seed=0, max_context_tokens=20_000, tasks=16)
    g = df.groupby("trajectory_id", sort=False)
    context = g["prompt_tokens"].sum() + g["output_tokens"].sum()
    truncated = g["truncated"].first()
    assert truncated.mean() > 0.3
    first_turn = g.head(1).set_index("trajectory_id")
    first_ctx = first_turn["prompt_tokens"] + first_turn["output_tokens"]
    # Over the limit only when the first turn alone is (a trajectory keeps >= 1 turn).
    assert ((context <= 20_000) | (context == first_ctx)).all()
    assert (g["reward"].first()[truncated] == 0).all()


def test_long_tail_shape_of_the_sample():
    stats = trace_stats(load_trace(sample_trace_path()))
    turns = stats.loc["turns_per_trajectory"]
    assert 20 <= turns["p50"] <= 60 and turns["max"] >= 2.5 * turns["p50"]
    ctx = stats.loc["context_tokens_per_trajectory"]
    assert 80_000 <= ctx["max"] <= 200_000
    env = stats.loc["env_seconds_per_turn"]
    assert env["p50"] < 5 and env["max"] > 60  # seconds typically, minutes in the tail
    assert stats.loc["branched", "count"] > 0 and stats.loc["truncated", "count"] > 0


def test_seed_scale_shape_on_a_slice():
    df = generate_trace("swe-seed", seed=0, tasks=96)
    stats = trace_stats(df)
    turns = df.groupby("trajectory_id", sort=False).size()
    assert np.percentile(turns, 90) > 200  # the long component: hundreds of turns
    assert stats.loc["context_tokens_per_trajectory", "max"] > 500_000
    assert stats.loc["context_tokens_per_trajectory", "max"] <= 1_000_000 + 50_000
    assert stats.loc["env_seconds_per_trajectory", "max"] > 3600


def test_scales_and_overrides():
    base = trace_stats(generate_trace("uniform", seed=0, tasks=4))
    half = trace_stats(generate_trace("uniform", seed=0, tasks=4, turns_scale=0.5,
                                      tokens_scale=2.0))
    assert half.loc["turns_per_trajectory", "max"] == base.loc["turns_per_trajectory",
                                                               "max"] / 2
    assert half.loc["output_tokens_per_turn", "max"] == 2 * base.loc[
        "output_tokens_per_turn", "max"]
    with pytest.raises(ConfigError, match="did you mean 'tasks'"):
        generate_trace("uniform", seed=0, taks=3)
    with pytest.raises(ConfigError, match=r"unknown trace preset 'unifrom'.*'uniform'"):
        generate_trace("unifrom", seed=0)
    with pytest.raises(ConfigError, match=r"branch_frac=1\.5"):
        GenParams(branch_frac=1.5)
    with pytest.raises(ConfigError, match="tasks=0"):
        generate_trace("uniform", seed=0, tasks=0)


@pytest.mark.slow
def test_full_seed_scale_generates_in_under_a_minute():
    t0 = time.perf_counter()
    df = generate_trace("swe-seed", seed=0)
    assert time.perf_counter() - t0 < 60
    assert df["task_id"].nunique() == 3072
