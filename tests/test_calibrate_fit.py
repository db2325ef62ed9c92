"""The calibration fit on synthetic measurements (fakes: rows generated from a known cost
model, so the fit must recover its constants; noise and a formula mismatch must show in
the reported quality). The live measurements themselves are tested in tests/live."""

from __future__ import annotations

import math
import tomllib
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from rlsched.calibration import fit_measurements, refit
from rlsched.calibration_io import write_calibration
from rlsched.cluster.errors import ConfigError
from rlsched.sim.calibration import fit_all, quality
from rlsched.sim.cost import CostModel

TINY = {"params": 1.4e6, "layers": 2, "d_model": 128, "kv_heads": 4, "head_dim": 32,
        "bytes_per_param": 4.0, "kv_bytes_per_elem": 4.0, "peak_flops": 5e10, "hbm_bw": 1.5e10,
        "max_num_seqs": 64}
TRUE = {"decode_overhead_s": 0.006, "decode_bw_eff": 0.05, "decode_compute_eff": 0.05,
        "prefill_eff": 0.02, "train_mfu": 0.05, "optimizer_step_s": 0.09,
        "sync_latency_s": 0.2, "sync_bw": 2e8, "switch_s": 15.0}


def fake_rows(truth: CostModel, noise: float = 0.0, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)

    def jitter(x: float) -> float:
        return x * (1.0 + noise * rng.standard_normal())

    rows = []
    for b in (1, 2, 4, 8, 16, 32):
        for ctx_each in (32, 256, 1024):
            for k in range(4):
                ctx = b * (ctx_each + k)
                rows.append({"component": "decode", "batch": b, "context": ctx,
                             "seconds": jitter(truth.decode_step_s(1, b, ctx))})
    for new in (16, 128, 512, 1536):
        for cached in (0, 512, 1536):
            t = truth.prefill_s(1, new, cached) + truth.decode_step_s(1, 1, new + cached)
            rows.append({"component": "prefill", "new": new, "cached": cached, "seconds": jitter(t)})
    rows.append({"component": "kv", "kv_capacity": 16384, "block_size": 16, "blocks": 1024})
    for n, length in ((1, 256), (2, 512), (4, 1024), (8, 768)):
        for world in (1, 2):
            t = truth.train_s(n * truth.train_flops(length), world)
            rows.append({"component": "train", "samples": n, "tokens_each": length,
                         "tokens": n * length, "world": world, "seconds": jitter(t)})
    rows += [{"component": "optimizer", "seconds": jitter(truth.optimizer_step_s)} for _ in range(3)]
    for nbytes in (5.5e6, 1.2e6, 0.5e6):
        rows += [{"component": "sync", "bytes": nbytes,
                  "seconds": jitter(truth.sync_latency_s + nbytes / truth.sync_bw)} for _ in range(3)]
    rows += [{"component": "switch", "kind": k, "seconds": jitter(truth.switch_s)}
             for k in ("to_rollout", "to_train")]
    rows += [{"component": "tool", "kind": "submit", "seconds": 0.4}]
    return pd.DataFrame(rows)


def truth_model() -> CostModel:
    return replace(CostModel(), **TINY, **TRUE)


def test_fit_recovers_known_constants():
    truth = truth_model()
    cal = fit_all(fake_rows(truth), replace(CostModel(), **TINY), tp=1)
    for name, value in TRUE.items():
        got = getattr(cal.cost, name)
        assert got == pytest.approx(value, rel=0.02), name
    assert cal.cost.kv_capacity_tokens(1) == 16384
    by = {q.component: q for q in cal.quality}
    for comp in ("decode", "prefill", "train", "sync"):
        assert by[comp].r2 > 0.999, comp
        assert by[comp].worst_residual_pct < 1.0, comp
    assert math.isnan(by["switch"].r2)  # a constant has no R²


def test_noise_shows_in_quality_not_in_a_perfect_score():
    cal = fit_all(fake_rows(truth_model(), noise=0.2, seed=3), replace(CostModel(), **TINY), tp=1)
    decode = next(q for q in cal.quality if q.component == "decode")
    assert decode.r2 < 0.999
    assert decode.worst_residual_pct > 10.0


def test_a_formula_mismatch_is_reported_as_a_poor_fit():
    """Train time with a fixed 0.2 s per call: the FLOP-proportional formula cannot follow
    it, and the quality says so instead of hiding it."""
    rows = fake_rows(truth_model())
    m = rows["component"] == "train"
    rows.loc[m, "seconds"] = rows.loc[m, "seconds"] + 0.2
    cal = fit_all(rows, replace(CostModel(), **TINY), tp=1)
    train = next(q for q in cal.quality if q.component == "train")
    assert train.worst_residual_pct > 20.0  # the short micro-batches are far off
    clean = fit_all(fake_rows(truth_model()), replace(CostModel(), **TINY), tp=1)
    assert train.r2 < next(q for q in clean.quality if q.component == "train").r2


def test_too_few_measurements_is_one_line():
    rows = fake_rows(truth_model())
    rows = rows[rows["component"] != "decode"]
    with pytest.raises(ConfigError, match="0 decode measurements"):
        fit_all(rows, replace(CostModel(), **TINY), tp=1)


def test_quality_of_exact_prediction():
    y = np.array([1.0, 2.0, 3.0])
    q = quality("x", y, y.copy(), {})
    assert q.r2 == 1.0 and q.worst_residual_s == 0.0


def test_written_file_loads_unchanged_and_refits(tmp_path):
    info = {"model_dir": "tiny", "on_gpus": False, "gpus": 2, "tp": 1, "seconds": 1.0,
            "machine_peaks": {"peak_flops": TINY["peak_flops"], "hbm_bw": TINY["hbm_bw"]}, "base": TINY}
    result = fit_measurements(fake_rows(truth_model()), info)
    path = write_calibration(tmp_path / "cost.toml", result)
    loaded = CostModel.from_file(path)
    assert loaded == result.calibration.cost
    data = tomllib.loads(path.read_text())
    assert data["calibration"]["fit"]["decode"]["r2"] > 0.999
    again = refit(tmp_path / "cost.measurements.csv")
    assert again.calibration.cost == result.calibration.cost


def test_refit_of_a_wrong_file_is_one_line(tmp_path):
    bad = tmp_path / "x.measurements.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match=r"x.info.json: not found"):
        refit(bad)
    (tmp_path / "x.info.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"not a calibration"):
        refit(bad)
    with pytest.raises(ConfigError, match=r"expected a NAME.measurements.csv"):
        refit(tmp_path / "good.csv")


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda t, i: t.__setitem__("seconds", -t["seconds"]), r"row 0 \(\w+\): seconds=-[\d.e-]+: expected a finite number > 0"),
    (lambda t, i: t.loc.__setitem__((0, "seconds"), float("nan")), r"row 0 \(\w+\): seconds=\(empty\)"),
    (lambda t, i: i.__setitem__("base", "x"), r"a.info.json: field base='x': expected a table"),
    (lambda t, i: i["base"].__setitem__("foo", 1), r"cannot re-fit \(TypeError: .*foo"),
    (lambda t, i: i.__setitem__("tp", "abc"), r"cannot re-fit \(ValueError"),
], ids=["negative-seconds", "missing-seconds", "base-not-a-table", "unknown-base-field", "tp-text"])
def test_refit_of_an_edited_calibration_is_one_line(tmp_path, edit, needle):
    """Each was a SciPy, dataclass or int() traceback."""
    import json

    info = {"model_dir": "tiny", "on_gpus": False, "gpus": 2, "tp": 1, "seconds": 1.0,
            "machine_peaks": {"peak_flops": TINY["peak_flops"], "hbm_bw": TINY["hbm_bw"]}, "base": dict(TINY)}
    write_calibration(tmp_path / "a.toml", fit_measurements(fake_rows(truth_model()), info))
    table = pd.read_csv(tmp_path / "a.measurements.csv")
    meta = json.loads((tmp_path / "a.info.json").read_text())
    edit(table, meta)
    table.to_csv(tmp_path / "a.measurements.csv", index=False)
    (tmp_path / "a.info.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=needle):
        refit(tmp_path / "a.measurements.csv")


def test_cli_refuses_a_non_toml_out_and_refits(tmp_path, capsys):
    from rlsched.cli import main

    assert main(["calibrate", "--out", str(tmp_path / "cost.json")]) == 2
    assert "expected a .toml file name" in capsys.readouterr().err
    info = {"model_dir": "tiny", "on_gpus": False, "gpus": 2, "tp": 1, "seconds": 1.0,
            "machine_peaks": {"peak_flops": TINY["peak_flops"], "hbm_bw": TINY["hbm_bw"]}, "base": TINY}
    write_calibration(tmp_path / "a.toml", fit_measurements(fake_rows(truth_model()), info))
    assert main(["calibrate", "--from-measurements", str(tmp_path / "a.measurements.csv"),
                 "--out", str(tmp_path / "b.toml")]) == 0
    err = capsys.readouterr().err
    assert "decode" in err and "R²" in err
    assert CostModel.from_file(tmp_path / "b.toml") == CostModel.from_file(tmp_path / "a.toml")
