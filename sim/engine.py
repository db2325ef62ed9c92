"""One inference engine as a shared-rate decode server.

Every sequence in an engine's decode batch gains one token per decode step, so all of
them advance at the same per-sequence rate. Instead of one event per token we keep a
single *progress* counter ``P`` (tokens each batch member has produced since the engine
started) and a heap of the progress values at which members finish their turn. The rate
is recomputed only when the batch changes (a turn starts or ends, a trajectory moves),
which is O(log n) per change -- never a rescan of the batch.

Prefill and weight sync are *stalls*: the engine makes no decode progress while it runs
them (vLLM interleaves chunked prefill with decode; charging it as a stall gives the same
total engine time). Context grows during decode; it is sampled at each batch change,
which is exact whenever turns are short relative to the context (the usual case) and is
documented as the model's approximation.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field

from .cost import CostModel

_EPS = 1e-9


@dataclass(slots=True)
class Member:
    """A trajectory in the decode batch (join bookkeeping for O(1) context sums)."""

    target: float  # progress value at which its turn ends
    base: float  # context at join minus progress at join
    seq: int


@dataclass(slots=True)
class EngineSim:
    id: int
    first_gpu: int
    tp: int
    cost: CostModel
    kv_capacity: int
    version: int = 0
    progress: float = 0.0
    updated: float = 0.0
    rate: float = 0.0  # tokens/s per sequence (0 with an empty batch)
    stall_end: float = 0.0
    sync_end: float = -1.0
    heap: list[tuple[float, int, str]] = field(default_factory=list)
    members: dict[str, Member] = field(default_factory=dict)
    ctx_base: float = 0.0  # sum of member.base
    kv_reserved: int = 0
    reservations: dict[str, int] = field(default_factory=dict)
    env_lru: OrderedDict[str, None] = field(default_factory=OrderedDict)  # in tool time, KV held
    evicted: list[str] = field(default_factory=list)  # drained by the driver after reserve()
    wake_at: float = float("inf")
    seq_counter: int = 0

    # ------------------------------------------------------------ progress
    def advance(self, now: float) -> None:
        start = self.updated if self.updated > self.stall_end else self.stall_end
        if now > start and self.rate > 0.0:
            self.progress += (now - start) * self.rate
        self.updated = now

    def _recompute_rate(self) -> None:
        b = len(self.members)
        if b == 0:
            self.rate = 0.0
            return
        context = self.ctx_base + b * self.progress
        self.rate = 1.0 / self.cost.decode_step_s(self.tp, b, context)

    def stall(self, now: float, seconds: float) -> float:
        """Add ``seconds`` of engine-blocking work (prefill, sync); return when it ends."""
        self.advance(now)
        self.stall_end = (self.stall_end if self.stall_end > now else now) + seconds
        return self.stall_end

    # --------------------------------------------------------------- batch
    def join(self, now: float, tid: str, context: float, tokens: float) -> None:
        """``tid`` decodes ``tokens`` more tokens on top of ``context`` (after any stall)."""
        self.advance(now)
        self.seq_counter += 1
        m = Member(self.progress + tokens, context - self.progress, self.seq_counter)
        self.members[tid] = m
        self.ctx_base += m.base
        heapq.heappush(self.heap, (m.target, m.seq, tid))
        self._recompute_rate()

    def leave(self, now: float, tid: str, tokens: int) -> int:
        """Remove a member early (interrupt, migration). ``tokens`` is what it joined to
        produce; return how many of them it has produced (whole tokens)."""
        self.advance(now)
        m = self.members.pop(tid)
        self.ctx_base -= m.base
        self._recompute_rate()
        left = m.target - self.progress
        return max(0, min(tokens, int(tokens - left))) if left > 0 else tokens

    def pop_due(self, now: float) -> list[str]:
        """Members whose turn has ended by ``now`` (in finish order)."""
        self.advance(now)
        due: list[str] = []
        heap, members = self.heap, self.members
        while heap:
            target, seq, tid = heap[0]
            m = members.get(tid)
            if m is None or m.seq != seq:
                heapq.heappop(heap)  # stale entry of a member that left
                continue
            if target > self.progress + 1e-6 * (1.0 + target):
                break
            heapq.heappop(heap)
            del members[tid]
            self.ctx_base -= m.base
            due.append(tid)
        if due:
            self._recompute_rate()
        return due

    def next_finish(self, now: float) -> float:
        """Time the earliest member finishes at the current rate (inf if none)."""
        heap, members = self.heap, self.members
        while heap:
            target, seq, tid = heap[0]
            m = members.get(tid)
            if m is None or m.seq != seq:
                heapq.heappop(heap)
                continue
            begin = self.stall_end if self.stall_end > now else now
            remaining = target - self.progress
            return begin + (remaining / self.rate if remaining > 0 else 0.0)
        return float("inf")

    # ------------------------------------------------------------------ KV
    def reserve(self, tid: str, tokens: int) -> bool:
        """Grow ``tid``'s KV reservation to ``tokens``; evict idle contexts if needed."""
        have = self.reservations.get(tid, 0)
        need = tokens - have
        if need <= 0:
            return True
        while self.kv_reserved + need > self.kv_capacity and self.env_lru:
            victim = next(iter(self.env_lru))
            if victim == tid:
                break
            self.evict(victim)
        if self.kv_reserved + need > self.kv_capacity:
            return False
        self.reservations[tid] = tokens
        self.kv_reserved += need
        return True

    def evict(self, tid: str) -> None:
        self.release(tid)
        self.env_lru.pop(tid, None)
        self.evicted.append(tid)

    def release(self, tid: str) -> None:
        self.kv_reserved -= self.reservations.pop(tid, 0)

    @property
    def decoding(self) -> int:
        return len(self.members)

    def busy(self, now: float) -> bool:
        return bool(self.members) or self.stall_end > now + _EPS
