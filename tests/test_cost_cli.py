"""``rlsched cost show|list`` for every preset, and ``--model/--gpu`` / ``[cost] model`` on
the simulator's front doors."""

from __future__ import annotations

import pandas as pd
import pytest

from rlsched.cli import main
from rlsched.sim.presets import GPUS, MODELS


@pytest.mark.parametrize("model", list(MODELS))
def test_cost_show_every_model(model: str, capsys) -> None:
    for gpu in GPUS:
        assert main(["cost", "show", "--model", model, "--gpu", gpu, "--tp", "8"]) == 0
        out = capsys.readouterr().out
        assert "trainer    floor" in out and "memory     per GPU" in out and "sync" in out
        assert "KV capacity" in out


def test_cost_show_dense_figures_and_default(capsys) -> None:
    assert main(["cost", "show", "--model", "qwen2.5-32b", "--gpu", "h200", "--tp", "4"]) == 0
    out = capsys.readouterr().out
    assert "KV capacity 1,688,385 tokens" in out
    assert "floor 8 GPUs = tp 4 x pp 1 x cp 1 x dp 2; grows by 4 GPUs" in out
    assert "1.04 s within a domain, 1.32 s across domains" in out
    assert main(["cost", "show"]) == 0  # the default is that preset
    assert "floor 8 GPUs = tp 4 x pp 1 x cp 1 x dp 2; grows by 4 GPUs" in capsys.readouterr().out
    assert main(["cost", "show", "--model", "none"]) == 0  # the flat historic model
    assert "memory not modelled (no preset)" in capsys.readouterr().out
    assert main(["cost", "show", "--model", "ref-2.4t", "--gpu", "h200", "--seq", "700000"]) == 0
    assert "sized for 700,000-token sequences" in capsys.readouterr().out


def test_cost_list_names_sources(capsys) -> None:
    assert main(["cost", "list"]) == 0
    out = capsys.readouterr().out
    for name in [*MODELS, *GPUS]:
        assert name in out
    assert out.count("source:") == len(MODELS) + len(GPUS)
    assert "ASSUMPTION" in out  # the reference-scale MoE says what is assumed


def test_unknown_preset_is_one_line(capsys) -> None:
    assert main(["cost", "show", "--model", "qwen2.5-33b"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "did you mean qwen2.5-32b" in err


@pytest.mark.parametrize("context", ["nan", "-1", "inf"])
def test_cost_show_bad_context_is_one_line(context: str, capsys) -> None:
    """--context used to be taken as given: 'nan ms per step', '-32 context tokens'."""
    assert main(["cost", "show", "--context", context]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.count("\n") == 0 and f"--context={float(context)!r}: expected a finite number" in err
    assert captured.out == ""


def test_compare_with_a_preset_and_config(tmp_path, capsys) -> None:
    base = ["compare", "--no-report", "--gpus", "32", "--steps", "1", "--policies", "colocated,elastic"]
    assert main([*base, "--out", str(tmp_path / "a"), "--model", "qwen2.5-32b", "--gpu", "h100"]) == 0
    cfg = tmp_path / "run.toml"
    cfg.write_text('[cost]\nmodel = "qwen2.5-32b"\ngpu = "h100"\n')
    assert main([*base, "--out", str(tmp_path / "b"), "--config", str(cfg)]) == 0
    a = pd.read_csv(tmp_path / "a" / "summary.csv")
    b = pd.read_csv(tmp_path / "b" / "summary.csv")
    assert list(a.sim_seconds) == list(b.sim_seconds)
    assert main([*base, "--out", str(tmp_path / "c")]) == 0
    c = pd.read_csv(tmp_path / "c" / "summary.csv")
    assert list(c.sim_seconds) != list(a.sim_seconds)  # the preset changes the figures
    # a cluster smaller than the trainer's floor (16 on H100) is refused before running
    assert main(["compare", "--no-report", "--gpus", "8", "--steps", "1", "--policies", "colocated",
                 "--out", str(tmp_path / "d"), "--model", "qwen2.5-32b", "--gpu", "h100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (earlier commands' progress above it)
    assert "needs at least 16 GPUs (tp=8 pp=1 cp=1 x dp=2); the cluster has 8" in err
    assert err.startswith("rlsched: error: ") and "--model none" in err and not (tmp_path / "d").exists()


def test_live_run_refuses_a_preset(capsys) -> None:
    assert main(["run", "--live", "--out", "unused", "--policy", "colocated", "--model", "qwen2.5-7b"]) == 2
    assert "--model/--gpu choose the simulator's cost model" in capsys.readouterr().err


def test_cost_show_takes_a_tp_the_default_cluster_does_not_divide(capsys) -> None:
    """(It was refused as "gpus=64 is not a multiple of tp=3": cost show has no --gpus.)"""
    assert main(["cost", "show", "--tp", "3"]) == 0
    assert "engine     tp=3: KV capacity" in capsys.readouterr().out
    assert main(["cost", "show", "--tp", "0"]) == 2
    assert "tp=0: expected an integer >= 1" in capsys.readouterr().err


def test_an_empty_preset_name_and_a_fractional_count_are_refused(tmp_path, capsys) -> None:
    """(``--model ""`` ran the default preset; ``layers = 1.5`` was taken as it stood.)"""
    assert main(["cost", "show", "--model", ""]) == 2
    assert "--model '': expected a preset name" in capsys.readouterr().err
    cost = tmp_path / "c.json"
    cost.write_text('{"layers": 1.5}')
    assert main(["cost", "show", "--cost", str(cost)]) == 2
    assert "layers=1.5: expected a whole number" in capsys.readouterr().err
    cost.write_text('{"layers": 64.0}')
    assert main(["cost", "show", "--cost", str(cost)]) == 0


def test_memory_too_small_for_any_engine_names_the_fields(tmp_path, capsys) -> None:
    """(A tiny gpu_mem_util or hbm_bytes advised "use tp >= 131072", the search's cap.)"""
    from rlsched.traces import generate_trace, write_trace

    trace = write_trace(generate_trace("longtail-small", seed=1, tasks=4, samples=2, turns_scale=0.1),
                        tmp_path / "t.parquet")
    cost = tmp_path / "c.json"
    cost.write_text('{"gpu_mem_util": 1e-6}')
    assert main(["run", "--trace", str(trace), "--policy", "elastic", "--steps", "1",
                 "--out", str(tmp_path / "o"), "--cost", str(cost)]) == 2
    err = capsys.readouterr().err
    assert "no engine of up to 131,072 GPUs holds" in err and "gpu_mem_util=1e-06" in err
