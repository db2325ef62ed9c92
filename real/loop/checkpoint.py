"""Checkpoint and resume of a live run: what is kept after each optimizer step, and how a
``--resume`` finds it and checks that it may continue it.

Layout, inside the run directory::

    checkpoint/manifest.json   which step folder is current, the policy and config
    checkpoint/v0003/          after optimizer step 3 (version 3):
        trainer.pt             weights + AdamW state + version (written by the trainer lane)
        meta.json, events.parquet, intervals.parquet, trajectories.parquet, steps.parquet,
        trace.parquet          the run record as it stood (read_run reads the folder; its
                               meta holds the measurements and counters so far)

Why a manifest written last: the folder of step k+1 is filled while the manifest still
names step k, and ``manifest.json`` is replaced atomically (tmp + fsync + rename), so a
run killed at any instant leaves either the old or the new step complete -- never a mix.
Older step folders are removed only after the manifest names the new one.

What a resume continues from: every trajectory that was trained (or dropped) by version k
is kept as recorded; every other trajectory -- the rest of the interrupted step, batches
already dispatched under staleness >= 1, a partial rollout carried to the next step -- is
re-run from scratch, and the record says which (``meta.resumes``, ``Resume`` events).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd

from rlsched.cluster.errors import ConfigError, RecordError
from rlsched.cluster.record import RunRecord, read_run
from rlsched.real.record.recorder import replace_durably

FORMAT = "rlsched-live-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"

# [live] keys that change how a run is operated, not what it computes: a resume may differ.
OPERATIONAL_KEYS = frozenset({"max_wall_s", "start_timeout_s", "cache_dir", "object_store_mb", "env_workers"})
SETTLED = frozenset({"trained", "dropped"})


def root(out: Path) -> Path:
    return Path(out) / "checkpoint"


def step_dir(out: Path, version: int) -> Path:
    return root(out) / f"v{version:04d}"


def config_of(run: Any, settings: Any) -> dict[str, Any]:
    """The run's config as recorded: ``[cluster]``/``[run]`` fields and the ``[live]`` settings."""
    return {  # plain values only: simulator-only objects (a [faults] schedule) stay out
        "run": {f.name: getattr(run, f.name) for f in fields(run)
                if isinstance(getattr(run, f.name), int | float | str | bool | None) and f.name != "check"},
        "live": {f.name: _plain(getattr(settings, f.name)) for f in fields(settings)},
    }


def fingerprint(run: Any, settings: Any, gpus: int, tp: int) -> dict[str, Any]:
    """What must be equal for a resume to continue the same run (the live cluster as run)."""
    cfg = config_of(run, settings)
    out = {f"[run] {k}": v for k, v in cfg["run"].items() if k not in ("gpus", "tp")}
    out |= {f"[live] {k}": v for k, v in cfg["live"].items() if k not in OPERATIONAL_KEYS | {"gpus", "tp"}}
    out |= {"live gpus": gpus, "live tp": tp}
    return out


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


# ------------------------------------------------------------------------------- saving
def save(out: Path, version: int, *, policy: str, num_steps: int, fp: dict[str, Any],
         config: dict[str, Any], time: float) -> None:
    """Seal step ``version``: its folder already holds ``trainer.pt`` and the record; point
    the manifest at it, then drop older folders."""
    d = step_dir(out, version)
    if not (d / "trainer.pt").is_file():
        raise RecordError(f"{d / 'trainer.pt'}: missing; the trainer did not save step {version}")
    _write_json(root(out) / MANIFEST, {
        "format": FORMAT, "format_version": FORMAT_VERSION, "version": version, "dir": d.name,
        "policy": policy, "num_steps": num_steps, "time": time, "fingerprint": fp, "config": config,
    })
    for other in root(out).glob("v*"):  # only older ones: the trainer may be filling a newer one
        if other.is_dir() and other.name < d.name:
            shutil.rmtree(other, ignore_errors=True)


def publish_record(out: Path, version: int) -> None:
    """Copy step ``version``'s record to the run directory, file by file atomically, so
    ``rlsched report DIR`` works on a run that was stopped after that step."""
    d = step_dir(out, version)
    for name in ("events.parquet", "intervals.parquet", "trajectories.parquet", "steps.parquet",
                 "trace.parquet", "meta.json"):
        src = d / name
        if src.is_file():
            tmp = Path(out) / f".{name}.tmp"
            shutil.copyfile(src, tmp)
            replace_durably(tmp, Path(out) / name)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    replace_durably(tmp, path)
    try:  # the rename itself survives a crash once the folder is synced
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


# ------------------------------------------------------------------------------ resuming
@dataclass(frozen=True)
class Resumed:
    """A checkpoint a resume continues from (versions are the run's, absolute)."""

    out: Path
    version: int  # optimizer steps done and kept
    time: float  # run clock at the checkpoint (s)
    policy: str
    num_steps: int
    config: dict[str, Any]
    record: RunRecord  # the record as it stood after step ``version``
    trace: pd.DataFrame  # its recorded turns (read now: the resumed run replaces the folder)

    @property
    def trainer(self) -> Path:
        return step_dir(self.out, self.version) / "trainer.pt"

    def settled(self) -> pd.DataFrame:
        """Trajectory rows kept as recorded: trained or dropped by the checkpoint."""
        tr = self.record.trajectories
        return tr[tr["status"].isin(SETTLED)].reset_index(drop=True)

    def settled_ids(self) -> set[str]:
        return set(self.settled()["trajectory"])

    def settled_trace(self) -> pd.DataFrame:
        """The recorded turns of the settled trajectories (empty if none had turns)."""
        if self.trace.empty:
            return self.trace
        return self.trace[self.trace["trajectory_id"].isin(self.settled_ids())].reset_index(drop=True)


def read_manifest(out: Path) -> dict[str, Any]:
    """The manifest of the run in ``out``; one ConfigError line if it is not resumable."""
    out = Path(out)
    if not out.is_dir():
        raise ConfigError(f"--resume {out}: no such run directory")
    path = root(out) / MANIFEST
    if not path.is_file():
        meta = out / "meta.json"
        driver = _meta(meta).get("driver") if meta.is_file() else None
        if driver is not None and driver != "live":
            raise ConfigError(f"--resume {out}: a {driver} run, not a live run; only `run --live` runs resume")
        raise ConfigError(f"--resume {out}: no checkpoint/{MANIFEST} (not a live run, or it stopped before "
                          "its first optimizer step); start it again with --force")
    m = _meta(path)
    if m.get("format") != FORMAT or not isinstance(m.get("version"), int) or not isinstance(m.get("dir"), str):
        raise ConfigError(f"{path}: not an {FORMAT} manifest")
    if m.get("format_version", 0) > FORMAT_VERSION:
        raise ConfigError(f"{path}: checkpoint format {m.get('format_version')} is newer than this rlsched reads")
    return m


def load(out: Path, manifest: dict[str, Any], *, policy: str, fp: dict[str, Any]) -> Resumed:
    """Check that ``policy`` and ``fp`` continue the run of ``manifest``; read its checkpoint."""
    out = Path(out)
    version, total = int(manifest["version"]), int(manifest.get("num_steps", -1))
    if manifest.get("policy") != policy:
        raise ConfigError(f"--resume {out}: the run's policy is {manifest.get('policy')!r}, not {policy!r}; "
                          "resume with the run's own --policy (or leave --policy out)")
    recorded = manifest.get("fingerprint") or {}
    for key in sorted(set(recorded) | set(fp)):
        if recorded.get(key) != fp.get(key):
            raise ConfigError(f"--resume {out}: {key} is {fp.get(key)!r}, the run has {recorded.get(key)!r}; "
                              "resume with the run's own config (or leave --config out)")
    if version >= total:
        raise ConfigError(f"--resume {out}: the run is complete ({version} of {total} steps trained); nothing to resume")
    d = root(out) / manifest["dir"]
    try:
        record = read_run(d)
    except RecordError as exc:
        raise ConfigError(f"--resume {out}: checkpoint unreadable: {exc}") from None
    if not (d / "trainer.pt").is_file():
        raise ConfigError(f"--resume {out}: {d / 'trainer.pt'} is missing; the checkpoint is damaged")
    trace = pd.DataFrame()
    if (d / "trace.parquet").is_file():
        try:
            trace = pd.read_parquet(d / "trace.parquet")
        except Exception as exc:  # pyarrow raises many types for a damaged file
            raise ConfigError(f"--resume {out}: {d / 'trace.parquet'} unreadable ({type(exc).__name__})") from None
    for stray in root(out).glob("v*"):  # a step folder the killed run had started filling
        if stray.is_dir() and stray.name != d.name:
            shutil.rmtree(stray, ignore_errors=True)
    return Resumed(out, version, float(manifest.get("time", 0.0)), str(manifest["policy"]), total,
                   dict(manifest.get("config") or {}), record, trace)

def _meta(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: unreadable ({exc.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return data


def publish_weights(trainer_pt: Path, store: Any, version: int) -> None:
    """Put the checkpoint's weights in the object store as ``version``, so the engines a
    resumed run starts load them (not the base checkpoint's)."""
    import torch

    from rlsched.cluster.errors import LiveBackendError
    from rlsched.real.model.convert import LlamaShape, megatron_to_hf

    try:
        data = torch.load(trainer_pt, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError) as err:
        raise LiveBackendError(f"{trainer_pt}: cannot read trainer checkpoint ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict) or "megatron" not in data or "hf_config" not in data:
        raise LiveBackendError(f"{trainer_pt}: not a trainer checkpoint")
    store.publish(megatron_to_hf(data["megatron"], LlamaShape.from_hf_config(data["hf_config"])), version)
