"""The local Ray cluster the live driver runs on, with one schedulable resource per slot.

Why a custom resource per slot: a GPU slot must belong to exactly one worker at a time,
and a role change must be *real* scheduling, not bookkeeping. Every slot ``k`` is a Ray
resource ``slot_k`` of capacity 1; an engine over slots ``(k, k+1)`` or a trainer rank on
slot ``k`` asks for exactly those units. A trainer rank for a slot an engine still holds
therefore cannot start until the engine's actor is gone -- Ray enforces the handover.
On a CPU host the slots are logical; on a GPU host each slot is also one GPU
(``num_gpus`` per worker), so Ray sets the worker's visible device.

Workers ask for no Ray CPUs (``num_cpus=0``): the slot resources bound concurrency, and
each worker limits its own torch threads.

A run may span an existing multi-node Ray cluster instead of a private local one: with
``RLSCHED_RAY_ADDRESS`` set (say ``127.0.0.1:6390``), :func:`start_cluster` connects to it
and checks that the nodes offer every slot resource between them (each node started with
``ray start ... --resources '{"slot_0": 1}'`` for the slots it hosts). Placement is then
Ray's: a worker for slot ``k`` runs on the node that has ``slot_k``. Nothing else assumes
one host: weights travel through Ray's object store, the trainer's gloo group meets at
rank 0's node address.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlsched.cluster.errors import LiveBackendError

NAMESPACE = "rlsched-live"
SLOT = "slot_{}"
ADDRESS_ENV = "RLSCHED_RAY_ADDRESS"  # join this Ray cluster instead of starting a private one


@dataclass(frozen=True)
class SlotCluster:
    """What :func:`start_cluster` started: ``num_slots`` slots, on GPUs or logical."""

    num_slots: int
    gpus: bool
    namespace: str
    start_seconds: float


def slot_resources(slot: int) -> dict[str, float]:
    """The Ray custom resources a worker on ``slot`` asks for (used by the trainer too)."""
    return {SLOT.format(slot): 1.0}


def slots_options(slots: Sequence[int], *, gpus: bool = False) -> dict[str, Any]:
    """``actor.options(**...)`` placing one worker on these slots (an engine's tp group)."""
    res: dict[str, float] = {}
    for s in slots:
        res |= slot_resources(s)
    opts: dict[str, Any] = {"num_cpus": 0, "resources": res}
    if gpus:
        opts["num_gpus"] = len(slots)
    return opts


def _host_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken CUDA install counts as none
        return 0


def check_capacity(num_slots: int, tp: int) -> None:
    """Refuse, in one line, a cluster this host cannot run: on a CPU host every engine is a
    vLLM process, so more engines than cores only thrash (the simulator's default of 64
    GPUs is not a live setting)."""
    if _host_gpus() >= num_slots:
        return
    cores = os.cpu_count() or 1
    engines = num_slots // max(tp, 1)
    if engines > max(2, cores):
        raise LiveBackendError(
            f"live cluster: gpus={num_slots}, tp={tp} would start {engines} vLLM engines on a CPU host "
            f"with {cores} cores and no GPUs; set [cluster] gpus = 2 and tp = 1 (or run on a GPU host)"
        )


def start_cluster(
    num_slots: int,
    *,
    object_store_mb: int = 256,
    use_gpus: bool | None = None,
    namespace: str = NAMESPACE,
) -> SlotCluster:
    """Start a private local Ray instance with ``num_slots`` slot resources.

    ``use_gpus=None`` uses GPUs when the host has at least ``num_slots`` of them. Any
    failure is one :class:`LiveBackendError` line that names the fix.
    """
    import ray

    if num_slots < 1:
        raise LiveBackendError(f"live cluster: {num_slots} slots requested; expected >= 1")
    host_gpus = _host_gpus()
    if use_gpus is None:
        use_gpus = host_gpus >= num_slots
    if use_gpus and host_gpus < num_slots:
        raise LiveBackendError(
            f"live cluster: {num_slots} GPU slots requested but this host has {host_gpus} GPUs; "
            f"lower [cluster] gpus to {host_gpus} or run on logical CPU slots"
        )
    if ray.is_initialized():
        ray.shutdown()
    address = os.environ.get(ADDRESS_ENV, "").strip()
    if address:
        return _join_cluster(address, num_slots, namespace, use_gpus)
    resources = {SLOT.format(k): 1.0 for k in range(num_slots)}
    t0 = time.perf_counter()
    try:
        ray.init(
            address="local",
            namespace=namespace,
            include_dashboard=False,
            num_cpus=max(1, os.cpu_count() or 1),
            num_gpus=num_slots if use_gpus else 0,
            resources=resources,
            object_store_memory=object_store_mb * 1024 * 1024,
            log_to_driver=False,
            logging_level="ERROR",
            configure_logging=True,
        )
    except Exception as exc:  # Ray raises many types (ports, /dev/shm, raylet crash)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise LiveBackendError(
            f"live cluster: Ray failed to start ({first}); check `ray status`/free /dev/shm "
            "and that no stale raylet holds the ports (`ray stop`)"
        ) from None
    return SlotCluster(num_slots, use_gpus, namespace, time.perf_counter() - t0)


def _join_cluster(address: str, num_slots: int, namespace: str, use_gpus: bool) -> SlotCluster:
    """Connect to the Ray cluster at ``address``; its nodes must offer ``slot_0..slot_{n-1}``."""
    import ray

    t0 = time.perf_counter()
    try:
        ray.init(address=address, namespace=namespace, log_to_driver=False, logging_level="ERROR",
                 configure_logging=True)
    except Exception as exc:  # Ray raises many types (no cluster there, version mismatch)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise LiveBackendError(f"live cluster: cannot join the Ray cluster at {ADDRESS_ENV}={address} ({first})") from None
    total = ray.cluster_resources()
    missing = [SLOT.format(k) for k in range(num_slots) if total.get(SLOT.format(k), 0.0) < 1.0]
    if missing:
        ray.shutdown()
        raise LiveBackendError(
            f"live cluster: the Ray cluster at {address} offers no {missing[0]} resource; start each node with "
            f"ray start ... --resources '{{\"{missing[0]}\": 1}}' for the slots it hosts ({num_slots} in all)"
        )
    gpus = use_gpus and total.get("GPU", 0.0) >= num_slots
    return SlotCluster(num_slots, bool(gpus), namespace, time.perf_counter() - t0)


def slot_nodes() -> dict[int, str]:
    """Slot -> the Ray node id that offers it (alive nodes; for reports and tests)."""
    import ray

    out: dict[int, str] = {}
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        for name in node.get("Resources", {}):
            if name.startswith("slot_") and name[5:].isdigit():
                out[int(name[5:])] = node["NodeID"]
    return out


def free_slots(cluster: SlotCluster) -> list[int]:
    """Slots no worker holds right now (Ray's own accounting)."""
    import ray

    avail = ray.available_resources()
    return [k for k in range(cluster.num_slots) if avail.get(SLOT.format(k), 0.0) >= 1.0]


def wait_ready(ref: Any, what: str, slots: Sequence[int], timeout_s: float) -> Any:
    """``ray.get`` of an actor's first call, turning a placement timeout into one line."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    try:
        return ray.get(ref, timeout=timeout_s)
    except GetTimeoutError:
        raise LiveBackendError(
            f"live cluster: {what} on slots {list(slots)} did not start within {timeout_s:.0f}s "
            "(no free slot: another worker still holds it, or the host is out of memory)"
        ) from None
    except RayActorError as exc:
        first = (str(exc).strip().splitlines() or ["actor died"])[0][:200]
        raise LiveBackendError(f"live cluster: {what} on slots {list(slots)} failed to start: {first}") from None


def stop_cluster() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
