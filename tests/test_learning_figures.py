"""Per-step learning figures of live runs: the trainer lane's aggregation
(``real/train/learning_figures.py``), the loss's KL / importance-ratio stats (``pg_loss``), the
steps table's extra columns, and the report's Learning section on a synthetic run record."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import pytest
from conftest_analysis import write_run

from rlsched.analysis.learning import LEARNING_COLUMNS as ANALYSIS_COLUMNS
from rlsched.analysis.learning import learning_table
from rlsched.analysis.load import load_run
from rlsched.analysis.report import write_report
from rlsched.real.train.learning_figures import LEARNING_COLUMNS, StepLearning, reward_figures


@dataclass(frozen=True)
class _S:  # the two fields StepLearning reads of a grpo.Sample
    group: str
    reward: float | None


def test_the_analysis_reads_exactly_the_columns_the_trainer_writes():
    assert tuple(LEARNING_COLUMNS) == ANALYSIS_COLUMNS


def test_reward_figures_by_hand():
    f = reward_figures({"a": [0.0, 1.0], "b": [1.0, 1.0, 1.0, 1.0]})
    assert f["reward_mean"] == pytest.approx(5 / 6)
    assert f["reward_group_std"] == pytest.approx((0.5 + 0.0) / 2)
    assert f["groups_varying"] == 0.5
    assert reward_figures({}) == {"reward_mean": None, "reward_group_std": None, "groups_varying": None}


def test_step_learning_weights_micro_batches_by_trained_tokens_and_resets():
    acc = StepLearning()
    acc.add([_S("a", 0.0), _S("a", 1.0)], {"trained_tokens": 10, "loss": 1.0, "kl_to_start": 0.1,
                                            "mean_token_staleness": 0.0, "max_token_staleness": 0,
                                            "clip_fraction": 0.0, "truncated_fraction": 0.0,
                                            "ratio_mean": 1.0, "ratio_min": 1.0, "ratio_max": 1.0})
    acc.add([_S("b", 1.0), _S("b", None)], {"trained_tokens": 30, "loss": 3.0, "kl_to_start": 0.5,
                                            "mean_token_staleness": 1.0, "max_token_staleness": 2,
                                            "clip_fraction": 0.2, "truncated_fraction": 0.1,
                                            "ratio_mean": 0.9, "ratio_min": 0.4, "ratio_max": 2.5})
    acc.add([], {"trained_tokens": 0, "loss": 99.0})  # an empty micro-batch changes nothing
    row = acc.row()
    assert list(row) == LEARNING_COLUMNS
    assert row["loss"] == pytest.approx((10 * 1.0 + 30 * 3.0) / 40)
    assert row["kl_to_start"] == pytest.approx((10 * 0.1 + 30 * 0.5) / 40)
    assert row["token_staleness_mean"] == pytest.approx(30 / 40)
    assert row["token_staleness_max"] == 2
    assert row["clip_fraction"] == pytest.approx(6 / 40)
    assert row["ratio_mean"] == pytest.approx((10 + 27) / 40)
    assert (row["ratio_min"], row["ratio_max"]) == (0.4, 2.5)
    assert row["reward_mean"] == pytest.approx(2 / 3)  # the sample without a reward is left out
    assert row["groups_varying"] == 0.5
    empty = acc.row()  # the next step starts from nothing
    assert all(v is None for v in empty.values())


def test_steps_table_gains_learning_columns_only_when_rows_have_them():
    pytest.importorskip("torch")  # live_record imports the live package's modules
    from rlsched.real.record.tables import STEP_COLUMNS, steps_table

    base = {"version": 1, "time": 1.0, "trajectories": 2, "trained_tokens": 5, "train_seconds": 0.1,
            "max_staleness": 0}
    assert list(steps_table([base]).columns) == STEP_COLUMNS
    with_learning = steps_table([{**base, **StepLearning().row()}, {**base, "version": 2, "loss": 0.5}])
    assert list(with_learning.columns) == STEP_COLUMNS + LEARNING_COLUMNS
    assert with_learning["loss"].dtype == "float64"
    assert math.isnan(with_learning["loss"].iloc[0]) and with_learning["loss"].iloc[1] == 0.5


def test_k3_kl_and_importance_ratio_stats_of_the_loss():
    torch = pytest.importorskip("torch")
    from rlsched.real.train.grpo import Sample
    from rlsched.real.train.pg_loss import (
        collate,
        collate_behaviour,
        k3_kl_sum,
        off_policy_loss_sum,
        token_logprobs,
    )

    torch.manual_seed(0)
    samples = [Sample([1, 2, 3, 4], [0, 1, 1, 1], 1.0, "g"), Sample([3, 2, 1], [0, 0, 1], -1.0, "g")]
    tokens, mask, adv = collate(samples)
    logits = torch.randn(2, 4, 7)
    logp = token_logprobs(logits, tokens)
    _, n, same = off_policy_loss_sum(logits, tokens, mask, adv, collate_behaviour(samples), reference_logprobs=logp)
    assert n == 4 and same["kl_sum"] == 0.0  # the starting policy itself: no divergence
    assert same["ratio_sum"] == n and same["ratio_min"] == same["ratio_max"] == 1.0  # on-policy
    assert same["clipped_tokens"] == 0
    ref = token_logprobs(torch.randn(2, 4, 7), tokens)
    _, _, moved = off_policy_loss_sum(logits, tokens, mask, adv, collate_behaviour(samples), reference_logprobs=ref)
    d = (ref - logp)[mask[:, 1:] > 0]
    assert moved["kl_sum"] == pytest.approx(float((torch.exp(d) - d - 1).sum()), rel=1e-6)
    assert moved["kl_sum"] > 0
    # padding never counts, however extreme the values there
    assert float(k3_kl_sum(logp, ref + 50.0 * (1 - mask[:, 1:]), mask[:, 1:])) == pytest.approx(moved["kl_sum"], rel=1e-6)
    _, _, without = off_policy_loss_sum(logits, tokens, mask, adv, collate_behaviour(samples))
    assert "kl_sum" not in without


def _learning_run(path, rows):
    """The hand run of the analysis tests, its steps table given learning columns."""
    write_run(path, driver="live")
    steps = pd.read_parquet(path / "steps.parquet")
    for c in LEARNING_COLUMNS:
        steps[c] = [float(r.get(c, math.nan)) for r in rows]
    steps.to_parquet(path / "steps.parquet", index=False)
    return path


ROWS = [
    {"reward_mean": 0.25, "reward_group_std": 0.4, "groups_varying": 1.0, "loss": 0.1, "kl_to_start": 0.0,
     "token_staleness_mean": 0.0, "token_staleness_max": 0.0, "clip_fraction": 0.0, "truncated_fraction": 0.0,
     "ratio_mean": 1.0, "ratio_min": 1.0, "ratio_max": 1.0},
    {"reward_mean": 0.75, "reward_group_std": 0.2, "groups_varying": 0.5, "loss": -0.2, "kl_to_start": 0.03,
     "token_staleness_mean": 0.5, "token_staleness_max": 1.0, "clip_fraction": 0.0, "truncated_fraction": 0.01,
     "ratio_mean": 0.98, "ratio_min": 0.5, "ratio_max": 2.4},
]


def test_learning_table_of_a_run_with_and_without_figures(tmp_path):
    table = learning_table(load_run(_learning_run(tmp_path / "live", ROWS)))
    assert list(table["step"]) == [0, 1]
    assert list(table["reward_mean"]) == [0.25, 0.75]
    assert table.loc[1, "kl_to_start"] == 0.03
    assert learning_table(load_run(write_run(tmp_path / "sim"))).empty


def test_report_has_a_learning_section_only_for_runs_that_learned(tmp_path):
    live = _learning_run(tmp_path / "runs" / "live", ROWS)
    sim = write_run(tmp_path / "runs" / "sim")
    page = write_report([live, sim], tmp_path / "both").read_text()
    assert "<h2>Learning</h2>" in page and 'alt="learning figures per step"' in page
    csv = pd.read_csv(tmp_path / "both" / "learning.csv")
    assert len(csv) == 2 and csv["reward_mean"].tolist() == [0.25, 0.75]
    assert csv["policy"].nunique() == 1  # the simulated run has no rows
    plain = write_report([sim], tmp_path / "sim-only").read_text()
    assert "Learning" not in plain
    assert not (tmp_path / "sim-only" / "learning.csv").exists()
