"""The live run's recorder: events and intervals kept in memory, written whole, per file
atomically, as often as the run needs a durable record.

Why not :class:`~rlsched.cluster.record.RunRecorder` directly: it streams row groups into
open Parquet writers and only writes their footers at ``close``, so a live run killed
mid-step would leave no readable record at all. A live run has thousands of events, not
millions, so it keeps them in columns here and, after every optimizer step, writes a
complete record (through ``RunRecorder`` itself, into a scratch folder, then renamed file
by file) -- the run directory then always holds a record that ``read_run`` accepts.

A resumed run counts versions from the checkpoint's (see ``checkpoint.py``): the driver and
the policy see versions and steps from 0, and ``base`` is added here on the way out, so the
record carries the run's absolute step and version numbers.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from rlsched.cluster.record import EVENT_SCHEMA, INTERVAL_SCHEMA, RunRecorder

RECORD_FILES = ("events.parquet", "intervals.parquet", "trajectories.parquet", "steps.parquet", "meta.json")


class MemoryRecorder:
    """``event``/``interval`` like ``RunRecorder``; ``base`` shifts step and version fields."""

    def __init__(self, base: int = 0, events: pd.DataFrame | None = None,
                 intervals: pd.DataFrame | None = None) -> None:
        self.base = base
        self.ev: dict[str, list[Any]] = {f.name: [] for f in EVENT_SCHEMA}
        self.iv: dict[str, list[Any]] = {f.name: [] for f in INTERVAL_SCHEMA}
        for cols, df in ((self.ev, events), (self.iv, intervals)):
            if df is not None and len(df):
                for name in cols:
                    cols[name].extend(df[name].tolist())

    def _shift(self, x: int) -> int:
        return x + self.base if x >= 0 else x

    def event(self, time: float, kind: str, *, step: int = -1, version: int = -1, engine: int = -1,
              gpu: int = -1, trajectory: str = "", detail: str = "") -> None:
        row = (time, kind, self._shift(step), self._shift(version), engine, gpu, trajectory, detail)
        for col, v in zip(self.ev.values(), row, strict=True):
            col.append(v)

    def interval(self, gpu_first: int, gpu_count: int, start: float, end: float, state: str,
                 step: int = -1) -> None:
        if end <= start:
            return
        row = (gpu_first, gpu_count, start, end, state, self._shift(step))
        for col, v in zip(self.iv.values(), row, strict=True):
            col.append(v)

    def write(self, directory: Path, trajectories: pd.DataFrame, steps: pd.DataFrame,
              meta: dict[str, Any]) -> None:
        """Write a complete run record into ``directory``; each file appears whole (tmp+rename)
        and ``meta.json`` last, so a reader never sees a half-written file."""
        directory = Path(directory)
        scratch = directory / ".record-tmp"
        shutil.rmtree(scratch, ignore_errors=True)
        rec = RunRecorder(scratch)
        n_ev, n_iv = len(self.ev["time"]), len(self.iv["start"])
        for i in range(n_ev):
            rec.event(self.ev["time"][i], self.ev["kind"][i], step=self.ev["step"][i],
                      version=self.ev["version"][i], engine=self.ev["engine"][i], gpu=self.ev["gpu"][i],
                      trajectory=self.ev["trajectory"][i], detail=self.ev["detail"][i])
        for i in range(n_iv):
            rec.interval(self.iv["gpu_first"][i], self.iv["gpu_count"][i], self.iv["start"][i],
                         self.iv["end"][i], self.iv["state"][i], self.iv["step"][i])
        rec.close(trajectories, steps, meta)
        for name in RECORD_FILES:
            replace_durably(scratch / name, directory / name)
        shutil.rmtree(scratch, ignore_errors=True)


def replace_durably(src: Path, dst: Path) -> None:
    """``os.replace`` after an fsync of ``src``: ``dst`` is the old file or the new one."""
    with open(src, "rb") as f:
        os.fsync(f.fileno())
    os.replace(src, dst)
