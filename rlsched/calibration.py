"""``rlsched calibrate``'s composition: live measurements in, a fitted cost model out.

The live backend (:mod:`rlsched.real.calibrate.run`) measures and the simulator's cost model
(:mod:`rlsched.sim.calibration`) is fitted to the measurements; the drivers never import
each other, so the two meet here, as everything else does in the command-line package.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from rlsched.cluster.errors import ConfigError
from rlsched.sim.calibration import Calibration, fit_all, tool_summary
from rlsched.sim.cost import CostModel


@dataclass(frozen=True)
class CalibrationRun:
    calibration: Calibration
    measurements: pd.DataFrame
    info: dict[str, Any]


def fit_measurements(table: pd.DataFrame, info: dict[str, Any]) -> CalibrationRun:
    """Fit a table of measurements (fresh, or read back by ``--from-measurements``)."""
    base = replace(CostModel(), **info["base"])
    fit = fit_all(_with_switch_gpus(table, int(info.get("gpus", 1))), base, int(info["tp"]))
    info = {**info, "tools_median_seconds": tool_summary(table), "measurements": len(table)}
    return CalibrationRun(fit, table, info)


def _with_switch_gpus(table: pd.DataFrame, gpus: int) -> pd.DataFrame:
    """Switch rows name how many GPUs switched together (``gpus``); measurements written
    before that column existed moved the whole cluster at once, so they get ``gpus``."""
    table = table.copy()
    if "gpus" not in table.columns:
        table["gpus"] = float("nan")
    switch = table["component"] == "switch"
    table.loc[switch, "gpus"] = table.loc[switch, "gpus"].fillna(gpus)
    return table


def refit(measurements_csv: Path) -> CalibrationRun:
    """Re-fit the measurements an earlier ``rlsched calibrate`` wrote (no live backend
    needed): ``cost.measurements.csv`` plus its ``cost.info.json``."""
    if not measurements_csv.name.endswith(".measurements.csv"):
        raise ConfigError(f"{measurements_csv}: expected a NAME.measurements.csv that rlsched calibrate "
                          "wrote (its NAME.info.json beside it)")
    info_path = measurements_csv.with_name(measurements_csv.name.replace(".measurements.csv", ".info.json"))
    for path in (measurements_csv, info_path):
        if not path.is_file():
            raise ConfigError(f"{path}: not found (--from-measurements reads NAME.measurements.csv and "
                              "the NAME.info.json beside it)")
    try:
        table = pd.read_csv(measurements_csv)
        info = json.loads(info_path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{measurements_csv}: cannot re-fit ({exc.__class__.__name__}; expected the "
                          f".measurements.csv and .info.json that rlsched calibrate wrote)") from None
    if "component" not in table.columns or not isinstance(info, dict) or "base" not in info:
        raise ConfigError(f"{measurements_csv}: not a calibration measurements file (no 'component' column or info)")
    _check_measurements(table, measurements_csv)
    for key in ("base", "machine_peaks"):
        if key in info and not isinstance(info[key], dict):
            raise ConfigError(f"{info_path}: field {key}={info[key]!r}: expected a table (an object of fields)")
    try:
        return fit_measurements(table, info)
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        # (an edited info.json or table the checks above let through: one line naming both files)
        raise ConfigError(f"{measurements_csv} / {info_path.name}: cannot re-fit "
                          f"({exc.__class__.__name__}: {str(exc).splitlines()[0][:160]}); expected the files "
                          "rlsched calibrate wrote, unedited") from None


def _check_measurements(table: pd.DataFrame, path: Path) -> None:
    """Every row's ``seconds`` is a finite number > 0, every other measured column holds
    finite numbers >= 0 where it has a value, and a KV capacity is > 0 (a seconds of -1, 0,
    NaN or text made the least-squares fit fail with a SciPy error; a capacity of 0 wrote
    a cost model with r2 = nan)."""
    for col in table.columns:
        if col in ("component", "kind"):
            continue
        raw = table[col]
        values = pd.to_numeric(raw, errors="coerce")
        floor_ok = values > 0 if col in ("seconds", "kv_capacity", "gpus") else values >= 0
        bad = (~floor_ok | (values == float("inf"))) & raw.notna()
        if col == "seconds":  # (every timed component has its seconds; the kv row has none)
            bad |= raw.isna() & (table["component"] != "kv")
        if bad.any():
            i = int(bad.to_numpy().argmax())
            need = "> 0" if col in ("seconds", "kv_capacity", "gpus") else ">= 0"
            v = raw.iloc[i]
            shown = repr(v) if isinstance(v, str) else f"{float(v):g}" if v == v else "(empty)"
            raise ConfigError(f"{path}: row {i} ({table['component'].iloc[i]}): {col}={shown}: "
                              f"expected a finite number {need}")
