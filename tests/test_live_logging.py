"""Live metrics for dashboards (``real/record/dashboards.py``): the scalars of one step, and a
TensorBoard event file that tensorboard's own reader reads back (issue #27 item 5)."""

from __future__ import annotations

import importlib.util

import pytest

from rlsched.cluster.config import LoggingConfig
from rlsched.cluster.errors import ConfigError
from rlsched.real.record.dashboards import (
    StepSample,
    check_available,
    loss_of,
    seconds_delta,
    step_scalars,
)


def _sample(**kw) -> StepSample:
    base = dict(version=3, seconds=10.0, gpus=2, trained_tokens=400, train_seconds=4.0, max_staleness=1,
                rewards=[1.0, 0.0, 0.5, float("nan")], output_tokens=[10, 30], loss_sum=-2.0, loss_tokens=400,
                generated_tokens=500, state_seconds={"generate": 12.0, "train": 6.0, "tool_wait": 2.0})
    return StepSample(**{**base, **kw})


def test_step_scalars_use_verl_names_and_measured_values() -> None:
    s = step_scalars(_sample())
    assert s["critic/score/mean"] == pytest.approx(0.5)  # the NaN reward is left out
    assert (s["critic/score/max"], s["critic/score/min"]) == (1.0, 0.0)
    assert s["critic/rewards/mean"] == s["critic/score/mean"]
    assert s["actor/pg_loss"] == pytest.approx(-0.005)
    assert s["perf/throughput"] == pytest.approx(400 / (10 * 2))
    assert s["perf/total_num_tokens"] == 400 and s["timing_s/step"] == 10.0
    assert s["timing_s/update_actor"] == 4.0 and s["rlsched/staleness/max"] == 1
    assert s["rlsched/generated_tokens_per_s"] == pytest.approx(50.0)
    assert s["response_length/mean"] == 20.0
    assert s["rlsched/gpu_share/generate"] == pytest.approx(0.6)
    assert sum(v for k, v in s.items() if k.startswith("rlsched/gpu_share/")) == pytest.approx(1.0)


def test_step_scalars_leave_out_what_was_not_measured() -> None:
    s = step_scalars(_sample(rewards=[], output_tokens=[], loss_sum=None, loss_tokens=0, seconds=0.0,
                             state_seconds={}))
    for name in ("critic/score/mean", "actor/pg_loss", "perf/throughput", "response_length/mean"):
        assert name not in s
    assert not any(k.startswith("rlsched/gpu_share/") for k in s)


def test_loss_and_seconds_deltas() -> None:
    assert loss_of([{"loss": 0.5, "trained_tokens": 10}, {"loss": 1.0, "trained_tokens": 30}]) == (35.0, 40)
    assert loss_of([{"trained_tokens": 10}]) == (None, 0)
    assert seconds_delta({"train": 5.0, "generate": 3.0}, {"train": 5.0, "generate": 1.0}) == {"generate": 2.0}


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed here")
def test_missing_logger_package_is_one_line_naming_what_to_install() -> None:
    with pytest.raises(ConfigError) as err:
        check_available(LoggingConfig(logger=("wandb",)))
    msg = str(err.value)
    assert "needs the wandb package" in msg and "pip install wandb" in msg and "\n" not in msg
    check_available(LoggingConfig(logger=("none",)))  # nothing to open, nothing needed


def test_tensorboard_event_file_reads_back(tmp_path) -> None:
    pytest.importorskip("tensorboard", reason="the [logging] extra (tensorboard) is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rlsched.real.record.dashboards import open_loggers

    [tb] = open_loggers(LoggingConfig(logger=("tensorboard",)), tmp_path / "run")
    tb.log(step_scalars(_sample(version=1)), 1)
    tb.log(step_scalars(_sample(version=2, rewards=[1.0])), 2)
    tb.close()
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    acc.Reload()
    got = [(e.step, e.value) for e in acc.Scalars("critic/score/mean")]
    assert got == [(1, pytest.approx(0.5)), (2, 1.0)]
    assert "rlsched/gpu_share/train" in acc.Tags()["scalars"]


def test_wandb_writes_an_offline_run(tmp_path, monkeypatch) -> None:
    pytest.importorskip("wandb", reason="wandb is not installed (it is optional: pip install wandb)")
    from rlsched.real.record.dashboards import open_loggers

    monkeypatch.setenv("WANDB_SILENT", "true")
    [wb] = open_loggers(LoggingConfig(logger=("wandb",), project="t"), tmp_path / "00-async", config={"gpus": 2})
    wb.log(step_scalars(_sample(version=1)), 1)
    wb.close()
    [run] = (tmp_path / "00-async" / "wandb").glob("offline-run-*")  # never synced: no network needed
    assert list(run.glob("run-*.wandb")) and run.name.endswith("-00-async")
