"""Fitting a trace's distributions and generating a larger trace like it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from importkit import MESSAGES, SWE, FakeWordCounter
from scipy import stats

from rlsched.cluster.errors import TraceError
from rlsched.traces import generate_trace, validate_trace
from rlsched.traces.fit import (
    DISTRIBUTIONS,
    compare_distributions,
    fit_trace,
    generate_like,
)
from rlsched.traces.importers import import_traces


def lognormal_trace(n_traj: int, seed: int) -> tuple[pd.DataFrame, dict[str, tuple]]:
    """A trace whose quantities are drawn from known lognormals (median, sigma)."""
    rng = np.random.default_rng(seed)
    truth = {"turns": (20.0, 0.5), "prompt": (400.0, 1.0), "task": (3000.0, 0.3),
             "output": (150.0, 0.8), "env": (2.0, 1.2)}

    def draw(key, size):
        median, sigma = truth[key]
        return median * np.exp(sigma * rng.standard_normal(size))

    lengths = np.maximum(np.floor(draw("turns", n_traj)), 1).astype(np.int64)
    n = int(lengths.sum())
    traj = np.repeat(np.arange(n_traj), lengths)
    turn = np.arange(n) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    prompt = np.floor(draw("prompt", n)).astype(np.int64)
    prompt[turn == 0] = np.floor(draw("task", n_traj)).astype(np.int64)
    df = pd.DataFrame({
        "task_id": [f"k{i // 4}" for i in traj], "trajectory_id": [f"j{i}" for i in traj],
        "turn": turn, "prompt_tokens": prompt,
        "output_tokens": np.floor(draw("output", n)).astype(np.int64),
        "env_seconds": draw("env", n),
    })
    return validate_trace(df, "test"), truth


@pytest.fixture(scope="module")
def known():
    return lognormal_trace(2000, seed=3)


@pytest.fixture(scope="module")
def known_fit(known):
    return fit_trace(known[0])


def test_fit_recovers_known_lognormals_with_small_ks(known):
    df, truth = known
    model, report = fit_trace(df, families=("lognorm",))
    assert list(report.index) == list(DISTRIBUTIONS)
    assert (report["family"] == "lognorm").all()
    # 2,000 trajectories, ~40,000 turns: the sup-gap between fitted and empirical CDF is small.
    assert report.loc["turns_per_trajectory", "ks_stat"] < 0.03
    for name in ("prompt_tokens_per_turn", "output_tokens_per_turn", "env_seconds_per_turn"):
        assert report.loc[name, "ks_stat"] < 0.01, name
    s, _, scale = model.env.params
    assert s == pytest.approx(truth["env"][1], rel=0.02)
    assert scale == pytest.approx(truth["env"][0], rel=0.03)
    s, _, scale = model.output.params
    assert s == pytest.approx(truth["output"][1], rel=0.03)
    assert scale == pytest.approx(truth["output"][0], rel=0.03)


def test_best_family_is_kept_and_a_wrong_family_shows_a_large_ks(known, known_fit):
    df, _ = known
    _, best = known_fit
    _, gamma = fit_trace(df, families=("gamma",))
    assert best.loc["env_seconds_per_turn", "family"] == "lognorm"
    assert gamma.loc["env_seconds_per_turn", "ks_stat"] > 5 * best.loc[
        "env_seconds_per_turn", "ks_stat"]


def test_generate_like_is_valid_deterministic_and_alike(known, known_fit):
    df, _ = known
    a = generate_like(df, seed=7, tasks=250, samples=8)
    b = known_fit[0].generate(seed=7, tasks=250, samples=8)
    pd.testing.assert_frame_equal(a, b)  # generate_like fits with seed 0: the same model
    assert not a.equals(known_fit[0].generate(seed=8, tasks=250, samples=8))
    assert a["trajectory_id"].nunique() == 2000 and a["task_id"].nunique() == 250
    pd.testing.assert_frame_equal(validate_trace(a, "again"), a)
    cmp = compare_distributions(df, a)
    assert (cmp.loc[["prompt_tokens_per_turn", "output_tokens_per_turn",
                     "env_seconds_per_turn"], "ks_stat"] < 0.02).all()
    assert cmp.loc["turns_per_trajectory", "ks_stat"] < 0.06
    # every sample of a task shares its task prompt
    first = a[a["turn"] == 0].groupby("task_id")["prompt_tokens"].nunique()
    assert (first == 1).all()


def test_env_zeros_are_a_point_mass():
    df, _ = lognormal_trace(300, seed=1)
    env = df["env_seconds"].to_numpy().copy()
    env[::4] = 0.0
    df = df.assign(env_seconds=env)
    model, report = fit_trace(df)
    assert report.loc["env_seconds_per_turn", "zero_frac"] == pytest.approx(0.25, abs=0.01)
    gen = model.generate(seed=0, tasks=100, samples=4)
    assert (gen["env_seconds"] == 0).mean() == pytest.approx(0.25, abs=0.03)


def test_constant_trace_fits_as_constants():
    df = generate_trace("uniform", seed=0, tasks=2, samples=2)
    model, report = fit_trace(df)
    assert report.loc["turns_per_trajectory", "family"] == "constant"
    assert report.loc["output_tokens_per_turn", "ks_stat"] == 0.0
    gen = model.generate(seed=1, tasks=3, samples=2)
    assert (gen.groupby("trajectory_id").size() == 20).all()
    assert set(gen["output_tokens"]) == {200}


def test_fit_an_imported_trace_and_scale_it_up():
    parts = [import_traces(fmt, [path], tokenizer=FakeWordCounter()).df
             for fmt, path in (("swe-agent", SWE), ("messages", MESSAGES))]
    df = validate_trace(pd.concat(parts, ignore_index=True), "both")
    model, report = fit_trace(df)
    assert report["ks_stat"].notna().all()
    assert "values estimated at import" in report.loc["env_seconds_per_turn", "note"]
    big = generate_like(df, seed=0, tasks=64, samples=8)
    assert big["trajectory_id"].nunique() == 512
    assert 0 < model.truncated_frac < 1 and big["truncated"].any()
    assert set(big["reward"].dropna().unique()) <= {0.0, 1.0}


def test_gen_overrides_drive_the_preset_generator(known, known_fit):
    _, truth = known
    model, _ = known_fit
    ov = model.gen_overrides()
    assert ov["output_tokens_median"] == pytest.approx(truth["output"][0], rel=0.05)
    out = generate_trace("longtail-small", seed=0, **{**ov, "tasks": 3, "samples": 2})
    assert out["trajectory_id"].nunique() == 6


def test_bad_arguments():
    df, _ = lognormal_trace(5, seed=0)
    with pytest.raises(TraceError, match="unknown distribution family 'nope'"):
        fit_trace(df, families=("nope",))
    with pytest.raises(TraceError, match=r"tasks=0 — expected a whole number >= 1"):
        generate_like(df, seed=0, tasks=0, samples=1)


def test_ks_statistic_matches_scipy_directly(known):
    df, _ = known
    model, report = fit_trace(df, families=("lognorm",))
    env = df["env_seconds"].to_numpy()
    direct = stats.kstest(env, stats.lognorm(*model.env.params).cdf).statistic
    assert report.loc["env_seconds_per_turn", "ks_stat"] == pytest.approx(direct)
