"""The trainer's data-parallel group: a gloo process group that can be re-formed.

Why not ``torch.distributed``'s default group: megatron-core keeps its model-parallel
state on the default group for the life of the process, and tearing that down whenever
the data-parallel width changes would mean rebuilding the model. Instead each rank owns
a plain ``ProcessGroupGloo`` over a fresh ``TCPStore`` (rank 0 hosts it on a free port);
a resize drops the old group and rendezvouses a new one with the new world size. On GPU
hosts the same pattern works with ``ProcessGroupNCCL``; this module uses gloo (CPU).
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT = timedelta(seconds=120)


def open_store(host: str, world: int) -> dist.TCPStore:
    """The rendezvous store, hosted by the rank-0 process on a free port (``store.port``)."""
    return dist.TCPStore(host, 0, world, is_master=True, wait_for_workers=False, timeout=TIMEOUT)


class DataParallelGroup:
    """One generation of the data-parallel group (rank, world size and the gloo group)."""

    def __init__(self, rank: int, world: int, host: str, port: int, *, local_host: str,
                 master_store: dist.TCPStore | None = None) -> None:
        self.rank, self.world = rank, world
        self._pg: dist.ProcessGroup | None = None
        self._store: dist.Store | None = None
        if world > 1:
            self._store = master_store or dist.TCPStore(host, port, world, is_master=False, timeout=TIMEOUT)
            options = dist.ProcessGroupGloo._Options()
            options._timeout = TIMEOUT
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=local_host)]
            self._pg = dist.ProcessGroupGloo(self._store, rank, world, options)

    def all_reduce_sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._pg is not None:
            self._pg.allreduce([tensor]).wait()
        return tensor

    def broadcast_(self, tensor: torch.Tensor, root: int = 0) -> torch.Tensor:
        if self._pg is not None:
            options = dist.BroadcastOptions()
            options.rootRank = root
            self._pg.broadcast([tensor], options).wait()
        return tensor

    def barrier(self) -> None:
        self.all_reduce_sum_(torch.zeros(1))

    def close(self) -> None:
        self._pg = None
        self._store = None
