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
    info_path = measurements_csv.with_name(measurements_csv.name.replace(".measurements.csv", ".info.json"))
    try:
        table = pd.read_csv(measurements_csv)
        info = json.loads(info_path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{measurements_csv}: cannot re-fit ({exc.__class__.__name__}; expected the "
                          f".measurements.csv and .info.json that rlsched calibrate wrote)") from None
    if "component" not in table.columns or not isinstance(info, dict) or "base" not in info:
        raise ConfigError(f"{measurements_csv}: not a calibration measurements file (no 'component' column or info)")
    return fit_measurements(table, info)
