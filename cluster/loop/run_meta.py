"""The run record's ``meta.json``: the keys both drivers write, typed once.

:class:`RunMeta` holds the keys every run record has (the analysis reads them whichever
driver wrote the record); what only one driver knows (the simulator's cost model, the live
driver's settings, measurements and resumes) goes in ``driver_fields``, written after
``config``. :meth:`RunMeta.to_dict` yields exactly the keys the record format has always
had; the keys are a public contract (add, never rename).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RunMeta:
    """One run's description, as ``meta.json`` stores it."""

    driver: str  # "sim" or "live"
    policy: str  # the canonical spec (name and parameters)
    policy_name: str
    num_gpus: int
    tp: int
    num_steps: int
    steps_done: int  # optimizer steps finished (the run's absolute version)
    complete: bool
    makespan_seconds: float
    lower_bound_seconds: float | None  # None where no bound is computed (live)
    max_staleness_bound: int  # the policy's declared bound
    seed: int
    config: Mapping[str, Any]  # the run config that ran
    events_processed: int
    faults: Mapping[str, Any] | None = None  # fault totals, with fault_schedule (both or neither)
    fault_schedule: Mapping[str, Any] | None = None
    driver_fields: Mapping[str, Any] = field(default_factory=dict)  # one driver's own keys
    extra: Mapping[str, Any] = field(default_factory=dict)  # the caller's keys, written last

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "driver": self.driver,
            "policy": self.policy,
            "policy_name": self.policy_name,
            "num_gpus": self.num_gpus,
            "tp": self.tp,
            "num_steps": self.num_steps,
            "steps_done": self.steps_done,
            "complete": self.complete,
            "makespan_seconds": self.makespan_seconds,
            "lower_bound_seconds": self.lower_bound_seconds,
            "max_staleness_bound": self.max_staleness_bound,
            "seed": self.seed,
            "config": self.config,
            **self.driver_fields,
            "events_processed": self.events_processed,
        }
        if self.faults is not None:
            out["faults"] = self.faults
            out["fault_schedule"] = self.fault_schedule
        out.update(self.extra)
        return out
