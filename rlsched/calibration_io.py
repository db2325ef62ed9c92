"""Writing a calibration: the cost-model file the simulator loads unchanged, plus what
it was fitted from.

``cost.toml`` holds a ``[cost]`` table (every field of :class:`~rlsched.sim.cost.CostModel`,
which ``CostModel.from_file`` and ``--cost`` read) and a ``[calibration]`` table that the
loader ignores: host facts, the fit quality per component and the tool-call medians.
Next to it, ``<stem>.measurements.csv`` (every raw measurement) and
``<stem>.predictions.csv`` (measured vs. the fitted formula, for the report's fit plot).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from rlsched.cluster.errors import ConfigError
from rlsched.sim.calibration import FitQuality

from .toml_write import toml_table


def _table(name: str, values: dict[str, Any]) -> list[str]:
    flat = {k: v for k, v in values.items() if not isinstance(v, dict)}
    return toml_table(name, flat, file="cost.toml", nonfinite=True)


def sidecar(path: Path, kind: str) -> Path:
    """``cost.toml`` -> ``cost.measurements.csv`` (``kind`` = measurements/predictions)."""
    return path.with_name(f"{path.stem}.{kind}.csv")


#: The files one calibration writes beside ``cost.toml`` (``cost.info.json`` is re-fitted from).
SIDECARS = ("measurements", "predictions")


def calibration_files(path: Path) -> tuple[Path, ...]:
    """Every file ``write_calibration(path, ...)`` writes: the TOML, its two CSVs, its info."""
    return (path, *(sidecar(path, k) for k in SIDECARS), path.with_name(f"{path.stem}.info.json"))


def check_calibration_out(path: Path) -> None:
    """Refuse an ``--out`` that cannot take the calibration, before anything is measured:
    a live calibration takes minutes, and a sidecar that could not be written (a folder of
    that name) used to end it in a traceback after ``cost.toml`` alone was written."""
    path = Path(path)
    if path.suffix != ".toml":
        raise ConfigError(f"--out {path}: expected a .toml file name (the cost-model file)")
    for target in calibration_files(path):
        if target.is_dir():
            what = "is a directory" if target == path else f"would write {target.name}, which is a directory there"
            raise ConfigError(f"--out {path}: {what}; give a file name such as cost.toml")
    for above in (path.parent, *path.parent.parents):
        if above.exists():
            if not above.is_dir():
                raise ConfigError(f"--out {path}: {above} is a file, not a directory")
            break


def write_calibration(path: Path, result: Any) -> Path:
    """Write ``path`` (TOML) and its sidecars (two CSVs, the info JSON); return ``path``.

    Each file is written beside its target and renamed into place only when all four
    were written, so a failed write (a full disk, a read-only folder) leaves no mix of new
    and old files and ends in one line."""
    path = Path(path)
    check_calibration_out(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {path}: cannot create its folder ({exc.strerror})") from None
    cal = result.calibration
    cost = cal.cost
    lines = [
        "# Cost model fitted by `rlsched calibrate` on the live backend (see sim/COST_MODEL.md).",
        "# [cost] is what the simulator loads; [calibration] records how well each part fits.",
        "",
        *_table("cost", {f.name: getattr(cost, f.name) for f in fields(cost)}),
        "",
        *_table("calibration", {
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "model_dir": Path(result.info["model_dir"]).name,
            "on_gpus": result.info["on_gpus"], "gpus": result.info["gpus"], "tp": result.info["tp"],
            "seconds": round(float(result.info["seconds"]), 1),
            "measurements": int(result.info["measurements"]),
            "measurements_csv": sidecar(path, "measurements").name,
            "predictions_csv": sidecar(path, "predictions").name,
        }),
        "",
        *_table("calibration.machine_peaks", result.info["machine_peaks"]),
        "",
        *_table("calibration.tools_median_seconds", result.info["tools_median_seconds"]),
    ]
    for q in cal.quality:
        lines += ["", *_table(f"calibration.fit.{q.component}", quality_row(q))]
    info = {k: v for k, v in result.info.items() if k not in ("tools_median_seconds", "measurements")}
    toml_path, measurements, predictions, info_path = calibration_files(path)
    writers: list[tuple[Path, Callable[[Path], object]]] = [
        (toml_path, lambda p: p.write_text("\n".join(lines) + "\n")),
        (measurements, lambda p: result.measurements.to_csv(p, index=False)),
        (info_path, lambda p: p.write_text(json.dumps(info, indent=2) + "\n")),
        (predictions, lambda p: cal.predictions.to_csv(p, index=False)),
    ]
    parts = [(target, target.with_name(f".{target.name}.part")) for target, _ in writers]
    try:
        for (_, part), (_, write) in zip(parts, writers, strict=True):
            write(part)
        for target, part in parts:
            os.replace(part, target)
    except OSError as exc:
        raise ConfigError(f"--out {path}: cannot write {Path(exc.filename or path).name} "
                          f"({exc.strerror or exc.__class__.__name__})") from None
    finally:
        for _, part in parts:
            with contextlib.suppress(OSError):
                part.unlink(missing_ok=True)
    return path


def quality_row(q: FitQuality) -> dict[str, Any]:
    return {"n": q.n, "r2": q.r2, "worst_residual_s": q.worst_residual_s,
            "worst_residual_pct": q.worst_residual_pct, "median_residual_pct": q.median_residual_pct,
            "note": q.note,
            **{f"fitted_{k}": v for k, v in q.fitted.items()}}
