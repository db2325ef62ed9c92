"""One inference engine as a shared-rate decode server.

Every sequence in an engine's decode batch gains one token per decode step, so all of
them advance at the same per-sequence rate. Instead of one event per token we keep a
single *progress* counter ``P`` (tokens each batch member has produced since the engine
started) and a heap of the progress values at which members finish their turn. The rate
is recomputed only when the batch changes (a turn starts or ends), which is O(log n) per
change -- never a rescan of the batch. (A member leaving mid-turn -- interrupt,
migration -- costs O(n); that happens a few times per step, not per turn.)

Prefill and weight sync are *stalls*: the engine makes no decode progress while it runs
them (vLLM interleaves chunked prefill with decode; charging it as a stall gives the same
total engine time). Context grows during decode; it is sampled at each batch change,
which is exact whenever turns are short relative to the context (the usual case) and is
documented as the model's approximation.

This is the simulator's innermost loop (a few calls per simulated turn), so members are
plain tuples, the cost model's decode and prefill formulas are evaluated from constants
folded once per engine (same operations in the same order, so the floats are identical
to :class:`~rlsched.sim.cost.CostModel`'s), and members are keyed by the driver's own
trajectory objects (hashed by identity) rather than looked up by id.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from heapq import heapify, heappop, heappush
from typing import Any

from .cost import CostModel
from .timers import NORMAL, Call

_EPS = 1e-9
# vLLM's admission watermark (CacheConfig.watermark, 1% of the KV blocks): while sequences
# decode, admission leaves this share free so that a sequence just preempted for room is
# not readmitted into the same room at the same instant
WATERMARK = 0.01
_INF = float("inf")


class KvPool:
    """KV tokens reserved on the engines that count for the cluster's rollout totals
    (open and not draining). ``ClusterState.rollout_totals`` reads ``total`` (see
    ``ClusterState.use_kv_source``): updating the tally through ``EngineState.set_kv``, a
    Python call on every turn, cost ~5% of a replay."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total = 0


class EngineSim:
    """Timing state of one rollout engine (the policy-visible part is its ``es``)."""

    ok = True  # (SimPy event protocol, see the driver's wake-up timer)

    __slots__ = (
        "_comp_den", "_expert", "_kv_tok", "_mem_den", "_miss", "_overhead", "_params2", "_per_seq",
        "_pre_attn", "_pre_den", "_weights", "callbacks", "closed", "cost", "counted", "ctx_base", "eid", "env_lru", "es",
        "evicted", "first_gpu", "gcode", "gsince", "gstate", "heap", "id", "kv_capacity", "kv_reserved",
        "members", "owns", "pool", "prefilling", "progress", "queue", "rate", "reservations", "seq_counter",
        "stall_end", "sync_end", "target_sum", "timer_at", "tp", "unborn", "updated", "version", "wake_at",
        "wake_callbacks",
    )

    def __init__(
        self, id: int, first_gpu: int, tp: int, cost: CostModel, kv_capacity: int,
        version: int = 0, es: Any = None,
    ) -> None:
        self.id = id
        self.first_gpu = first_gpu
        self.tp = tp
        self.cost = cost
        self.kv_capacity = kv_capacity
        self.version = version
        self.es = es  # the engine's ClusterState.EngineState (roles/queue seen by policies)
        self.progress = 0.0
        self.updated = 0.0
        self.rate = 0.0  # tokens/s per sequence (0 with an empty batch)
        self.stall_end = 0.0
        self.sync_end = -1.0
        # members: key -> (target progress, context at join minus progress at join)
        self.members: dict[Hashable, tuple[float, float]] = {}
        # (target, join seq, key, base), one per member: a member that leaves early takes its
        # entry out (rare), so the hot path never meets a stale entry
        self.heap: list[tuple[float, int, Any, float]] = []
        # members with nothing to decode whose prompt is still being prefilled: key -> when
        # that prefill ends (a turn of zero output tokens ends then, not at its join; rare)
        self.prefilling: dict[Hashable, float] = {}
        self.ctx_base = 0.0  # sum of member bases
        self.kv_reserved = 0
        self.reservations: dict[Hashable, int] = {}
        # while ``counted``, kv_reserved is part of pool.total (see count_in)
        self.pool: KvPool | None = None
        self.counted = False
        # in tool time, KV held, oldest tool call first (a key is always absent when a tool
        # call starts, so a plain dict keeps the order an LRU needs)
        self.env_lru: dict[Hashable, None] = {}
        self.evicted: list[Any] = []  # drained by the driver after reserve()
        self.wake_at = _INF
        self.seq_counter = 0
        # Reservations hold whole turns (context, prompt and output); of those, the tokens
        # not generated yet are ``unborn`` (admitted turns not decoding yet) plus, for the
        # members, target_sum - len(members) * progress (see used)
        self.unborn = 0.0
        self.target_sum = 0.0
        self.closed = False
        # the engine is the SimPy event of its own wake-up timer when none is pending
        self.callbacks: tuple | None = None
        self.timer_at = 0.0
        self.gstate: object = None  # GpuState of this engine's GPUs
        self.gcode = 0  # its index in the run record's state codes (gpus.CODE)
        self.gsince = 0.0  # since when (valid while it owns them, see GpuStates.claim)
        self.owns = False
        # where rearm() pushes the engine's wake-up timer (set by the driver; see .timers)
        self.queue: list = []
        self.eid: Any = None
        self.wake_callbacks: tuple = ()
        # the decode step's constants, folded once by the cost model (DecodeCoeffs.step_s is
        # the formula; _step below is its inlined form), and prefill_s's
        c = cost
        co = cost.decode_coefficients(tp, cost.spans_nodes(first_gpu, tp))
        self._weights = co.weights
        self._expert = co.expert
        self._miss = co.miss
        self._per_seq = co.per_seq
        self._kv_tok = co.kv_tok
        self._mem_den = co.mem_den
        self._params2 = co.params2
        self._comp_den = co.comp_den
        self._overhead = co.overhead
        self._pre_attn = 4 * c.layers * c.d_model
        self._pre_den = tp * c.peak_flops * c.prefill_eff

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
        self.rate = 1.0 / self._step(b, self.ctx_base + b * self.progress)

    def _step(self, b: int, context: float) -> float:
        """Seconds of one decode step: ``DecodeCoeffs.step_s`` on the folded constants (the
        same operations in the same order; a dense model skips the expert and per-sequence
        terms, which would add exact zeros)."""
        w = self._weights
        if self._expert != 0.0:
            w = w + self._expert * (1.0 - self._miss ** b)
        mem = (w + self._kv_tok * context) / self._mem_den
        comp = self._params2 * b / self._comp_den
        fixed = self._overhead
        if self._per_seq != 0.0:
            fixed = fixed + self._per_seq * b
        return fixed + (mem if mem > comp else comp)

    def stall(self, now: float, seconds: float) -> float:
        """Add ``seconds`` of engine-blocking work (prefill, sync); return when it ends."""
        self.advance(now)
        self.stall_end = (self.stall_end if self.stall_end > now else now) + seconds
        return self.stall_end

    # --------------------------------------------------------------- batch
    def join(self, now: float, key: Hashable, cached: int, new: int, tokens: float) -> float:
        """``key`` prefills ``new`` tokens on top of ``cached`` ones (a stall, if any are
        new), then decodes ``tokens`` more; returns when its prefill ends (``now`` with none
        new: a move before then leaves the prompt to be prefilled where it lands).
        (:meth:`advance`, :meth:`stall`, ``CostModel.prefill_s`` are inlined and
        :meth:`_step` is a C call when compiled: this runs every turn.)"""
        start = self.updated if self.updated > self.stall_end else self.stall_end
        if now > start and self.rate > 0.0:
            self.progress += (now - start) * self.rate
        self.updated = now
        if new > 0:
            prefill = (self._params2 * new + self._pre_attn * new * (cached + new / 2)) / self._pre_den
            self.stall_end = (self.stall_end if self.stall_end > now else now) + prefill
        self.seq_counter = seq = self.seq_counter + 1
        p = self.progress
        target = p + tokens
        base = (cached + new) - p
        members = self.members
        members[key] = (target, base)
        self.unborn -= tokens
        self.target_sum += target
        self.ctx_base += base
        heappush(self.heap, (target, seq, key, base))
        b = len(members)
        self.rate = 1.0 / self._step(b, self.ctx_base + b * p)
        if new > 0 and tokens <= 0.0:
            self.prefilling[key] = self.stall_end
        return self.stall_end if new > 0 else now

    def leave(self, now: float, key: Hashable, tokens: int) -> int:
        """Remove a member early (interrupt, migration). ``tokens`` is what it joined to
        produce; return how many of them it has produced (whole tokens)."""
        self.advance(now)
        target, base = self.members.pop(key)
        if self.prefilling:
            self.prefilling.pop(key, None)
        self.target_sum = self.target_sum - target if self.members else 0.0
        heap = self.heap
        i = next(j for j, entry in enumerate(heap) if entry[2] is key)
        last = heap.pop()
        if i < len(heap):
            heap[i] = last
            heapify(heap)
        self.ctx_base -= base
        self._recompute_rate()
        left = target - self.progress
        return max(0, min(tokens, int(tokens - left))) if left > 0 else tokens

    def pop_due(self, now: float) -> list[Any]:
        """Members whose turn has ended by ``now`` (in finish order). (:meth:`advance`
        inlined, :meth:`_step` a C call when compiled: this runs every turn.)"""
        start = self.updated if self.updated > self.stall_end else self.stall_end
        if now > start and self.rate > 0.0:
            self.progress += (now - start) * self.rate
        self.updated = now
        due: list[Any] = []
        heap, members = self.heap, self.members
        progress = self.progress
        held = None
        while heap:
            target, _, key, base = heap[0]
            # (due within float rounding only: a looser slack ended turns early whenever a
            # wake-up armed before the batch slowed fired, finishing runs below their bound)
            if target > progress + 1e-9 * (1.0 + target):
                break
            if self.prefilling and key in self.prefilling:
                if self.prefilling[key] > now:  # (its prompt's prefill has not ended)
                    if held is None:
                        held = []
                    held.append(heappop(heap))
                    continue
                del self.prefilling[key]
            heappop(heap)
            del members[key]
            self.target_sum -= target
            self.ctx_base -= base
            due.append(key)
        if due:
            b = len(members)
            if b == 0:
                self.rate = 0.0
                self.target_sum = 0.0
            else:
                self.rate = 1.0 / self._step(b, self.ctx_base + b * progress)
        if held is not None:
            for entry in held:
                heappush(heap, entry)
        return due

    def rearm(self, now: float) -> None:
        """Make sure a wake-up timer is pending for the earliest finish (at the current
        rate, after any stall): if that is now before the pending wake-up, push a timer
        for it onto the event queue (the engine itself is the timer event when it has
        none pending, else a :class:`~rlsched.sim.timers.Call`).

        A wake-up that the batch has since made too early is not cancelled: it fires, finds
        nothing due and re-arms (cheaper than cancelling entries in SimPy's heap)."""
        heap = self.heap
        if not heap:
            return
        begin = self.stall_end if self.stall_end > now else now
        remaining = heap[0][0] - self.progress
        # (or when the members' growing KV fills the engine: see used, overflowing)
        b = len(heap)
        full = (self.kv_capacity - self.kv_reserved + self.unborn + self.target_sum) / b - self.progress
        if full < remaining:
            remaining = full
        at = begin + (remaining / self.rate if remaining > 0 else 0.0)
        if self.prefilling:  # (a member of no output ends when its own prefill does)
            soonest = min(self.prefilling.values())
            if now < soonest < at:
                at = soonest
        if at == begin and remaining > 0:
            # The finish is nearer than the clock resolves at this time (``remaining`` is
            # above pop_due's tolerance, but ``remaining / rate`` is below half an ulp of
            # ``begin``: only far into a run, e.g. after a 1e12 s role switch).
            # Waking at ``begin`` would advance nothing and re-arm for ``begin`` forever;
            # one tick later the member is due.
            at = math.nextafter(begin, _INF)
        if at < self.wake_at - 1e-9:
            self.wake_at = at
            if self.callbacks is None:
                self.callbacks = self.wake_callbacks
                self.timer_at = at
                ev: Any = self
            else:
                ev = Call(self.wake_callbacks, None, self, at)
            heappush(self.queue, (now + (at - now if at > now else 0.0), NORMAL, next(self.eid), ev))

    # ------------------------------------------------------------------ KV
    # What policies see as ``EngineInfo.kv_used`` is ``kv_reserved``, kept in step here: the
    # tokens admission counts against ``kv_capacity`` -- every admitted trajectory's context
    # plus the turn it is generating, including idle contexts held through tool time (those
    # are resident until evicted, and eviction releases them).
    #
    # A reservation covers the whole turn, but only the tokens generated so far occupy the
    # cache (``used``): admission needs room for the context and prompt only, as vLLM
    # allocates a request's prompt blocks, so ``kv_reserved`` may exceed the capacity. When
    # the generated tokens fill the engine the wake-up timer fires (``rearm``) and the
    # driver evicts idle contexts, then preempts the newest running sequence
    # (``overflowing``; ``sim.lifecycle.Lifecycle._relieve``).
    def used(self, now: float) -> float:
        """KV tokens in the cache now: reservations less the tokens not generated yet."""
        self.advance(now)
        b = len(self.members)
        return self.kv_reserved - self.unborn - (self.target_sum - b * self.progress if b else 0.0)

    def overflowing(self, now: float) -> bool:
        """The members' KV has reached the engine's capacity (within float rounding)."""
        return self.used(now) >= self.kv_capacity - 1e-9 * (1.0 + self.kv_capacity)

    def free(self, now: float) -> float:
        """KV tokens admission may still reserve now (idle contexts not evicted): the
        capacity less ``used``, less the watermark while sequences decode."""
        if not self.members:
            return self.kv_capacity - (self.kv_reserved - self.unborn)
        return self.kv_capacity * (1.0 - WATERMARK) - self.used(now)

    def reserve(self, key: Hashable, tokens: int, pending: int, now: float) -> bool:
        """Admit a turn: grow ``key``'s reservation to ``tokens``, of which ``pending`` are
        still to be generated, if the rest fits (``free``), evicting idle contexts, oldest
        first, if needed."""
        have = self.reservations.get(key, 0)
        need = tokens - have
        if need <= 0:
            self.unborn += pending
            return True
        room = self.free(now)
        if need - pending > room:
            lru = self.env_lru
            while need - pending > room and lru:
                victim = next(iter(lru))
                if victim is key:
                    break
                freed = self.reservations.get(victim, 0)
                self.evict(victim)
                room += freed
            if need - pending > room:
                return False
        self.unborn += pending
        self.reservations[key] = tokens
        self.kv_reserved += need
        if self.es is not None:
            self.es.kv_used = self.kv_reserved
        if self.counted:
            self.pool.total += need
        return True

    def evict(self, key: Hashable) -> None:
        self.release(key)
        self.env_lru.pop(key, None)
        self.evicted.append(key)

    def release(self, key: Hashable) -> None:
        freed = self.reservations.pop(key, 0)
        self.kv_reserved -= freed
        if self.es is not None:
            self.es.kv_used = self.kv_reserved
        if self.counted:
            self.pool.total -= freed

    def count_in(self, pool: KvPool) -> None:
        """From now on the engine's reserved KV is part of ``pool.total``."""
        pool.total += self.kv_reserved
        self.pool, self.counted = pool, True

    def count_out(self) -> None:
        """The engine leaves rollout (drains or fails): its KV no longer counts."""
        if self.counted:
            self.pool.total -= self.kv_reserved
            self.counted = False

    @property
    def decoding(self) -> int:
        return len(self.members)

    def busy(self, now: float) -> bool:
        return bool(self.members) or self.stall_end > now + _EPS
