"""``elastic``'s tail: spreading the trajectories a step has left over the engines still
rolling out, so the longest decode where it is fastest.

* **Spread the tail that is left** (``steal``): an engine kept in rollout with nothing to
  do takes (``Move``) the trajectory predicted longest off an engine crowded with three
  or more, instead of idling beside it; the driver charges the KV transfer.
* **Isolate the tail** (``isolate``, on by default): once a step is down to its tail (at
  most two unfinished trajectories per rollout engine), its live trajectories, predicted
  longest first, each move once to the engine with the fewest live trajectories when
  they would share it with fewer than their own: decode on an engine slows with every
  sequence and KV token it holds, and with staleness a step's longest trajectory shares
  its engine with two batches' bulk. Measured against ``isolate=false`` (simulated, the
  elastic bench's six points and the regime map's twelve): at k=1 faster at five bench
  points (by up to 11% on the growing preset), slower by 0.3% at the sixth and by at most
  0.01% on the map; at k=0 faster at all six bench points (0.03-1.2%). It costs 0.7 points
  on one small no-harm case (4 engines, 8 trajectories a step: 2.3% behind the best async
  instead of 1.6%); ``isolate=false`` gives the earlier schedule.

* **Move queued work to where KV is free** (``rebalance``, on by default): a trajectory
  waiting in a KV-full engine's queue moves to an engine with no queue and room for twice
  its context. Placement pins a trajectory to an engine; under KV pressure its queue then
  waited while another engine had room.

All three move live trajectories of the rolling steps (steal and isolate ranked by the
predicted remaining turns, :mod:`~rlsched.policies.predict`), and each trajectory moves at
most once, by any of them (no ping-pong): :class:`TailSpreader` owns that ranking and that
record.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from operator import itemgetter

from rlsched.cluster.commands import Command, Interrupt, Move, Reassign
from rlsched.cluster.ids import TrajStatus
from rlsched.cluster.view import ClusterView

from ..placement import LateQueue
from ..predict import LengthPredictor, OracleLengths

# An engine is crowded, for stealing, from this many live trajectories on. Moving one of
# two measured worse than leaving them (the transfer, and an engine busy that the trainer
# could have had, on small long-tailed traces: the no-harm counterexample went from 1.7% to
# 2.6% behind the best async with 2, 1.6% with 3; the bench's figures were the same).
_CROWDED = 3
# A rolling step is in its tail, for ``isolate``, once it has no more than this many
# unfinished trajectories per rollout engine. Measured against no isolation (elastic bench,
# six k=1 points; regime map, twelve): 1: bench -3.1..+0.8%, map up to +0.6%; 2: bench
# -11.0..+0.3% (swe-seed 256), map -5.5..+0.01%; 3: bench -9.9..-0.6% but map +11.6% (qwen
# 256 GPUs, tail 0.05). No trigger won everywhere; 2 loses least, and is the default.
_TAIL_PER_ENGINE = 2
_LIVE = (TrajStatus.QUEUED, TrajStatus.RUNNING)
_LOAD = itemgetter(1)  # (engine, load) -> load


def _loads_of(loads: tuple[tuple[int, int], ...], engines: set[int]) -> dict[int, int]:
    """engine -> load for those of ``engines`` listed in ``loads`` (ascending ids: found
    by bisection, not by a pass over every engine)."""
    out = {}
    for e in engines:
        i = bisect_left(loads, (e, -1))  # (loads are >= 0: (e, -1) sorts just before e's)
        if i < len(loads) and loads[i][0] == e:
            out[e] = loads[i][1]
    return out


class TailSpreader:
    """Moves live trajectories of the rolling steps off crowded or KV-full engines
    (``steal``, ``isolate``, ``rebalance``), each at most once."""

    def __init__(self, predictor: LengthPredictor | OracleLengths) -> None:
        self._predictor = predictor
        self._moved: set[str] = set()  # trajectories moved already (never again)
        self._stolen_to: dict[int, str] = {}  # engine -> the trajectory it took last (steal)
        self._spread_of: tuple[tuple[tuple[int, int], ...], int, int] = ((), 0, 0)
        self._count_of: tuple[tuple[tuple[int, int], ...], Counter[int]] = ((), Counter())

    def _spread(self, loads: tuple[tuple[int, int], ...]) -> tuple[int, int]:
        """(lowest, highest) load of ``loads`` (``view.engine_loads()``). The view hands
        back the same tuple while no load changed (~3 in 4 asks at seed scale), so the
        answer is kept for it: steal and isolate ask on most events."""
        kept, lo, hi = self._spread_of
        if loads is not kept:
            ls = list(map(_LOAD, loads))
            lo, hi = min(ls, default=0), max(ls, default=0)
            self._spread_of = (loads, lo, hi)
        return lo, hi

    def _spread_without(self, loads: tuple[tuple[int, int], ...],
                        gone: dict[int, int]) -> tuple[int, int, int]:
        """(engines, lowest, highest load) of ``loads`` without the engines of ``gone``
        (engine -> its load in ``loads``), from a count of engines per load kept per tuple:
        no pass over every engine for the few that leave."""
        kept, count = self._count_of
        if loads is not kept:
            count = Counter(map(_LOAD, loads))
            self._count_of = (loads, count)
        left = count.copy()
        left.subtract(gone.values())
        have = [load for load, n in left.items() if n > 0]
        return sum(n for n in left.values() if n > 0), min(have, default=0), max(have, default=0)

    def _movable(self, view: ClusterView, step: int, skip: frozenset[str] = frozenset()
                 ) -> list[tuple[float, str, int]]:
        """(predicted remaining turns, id, engine) of ``step``'s live trajectories that are
        on an engine, were never moved (nor are in ``skip``) and are not at the one length
        every finished one ended at (:meth:`~rlsched.policies.predict.LengthPredictor.at_end`:
        on a trace with no length spread every trajectory ends within a second of the
        first, and isolating them then moved KV for nothing -- with the default preset's
        transfer costs 14% behind colocated on 12 engines), in the batch's order."""
        out = []
        moved = self._moved
        predictor = self._predictor
        for t in view.batch(step):  # (status first: a record only for the live few of a tail)
            if view.status(t) in _LIVE and t not in moved and t not in skip:
                i = view.trajectory(t)
                # (one at the length every finished one ended at is about to end: its KV
                # would move to save less than the transfer costs)
                if i.engine is not None and not predictor.at_end(i.task_id, i.turns_done):
                    out.append((predictor.remaining(t, i.task_id, i.turns_done), t, i.engine))
        return out

    def _move(self, t: str, src: int, dst: int, loads: dict[int, int]) -> Move:
        """Move ``t`` from engine ``src`` to ``dst``, once: ``loads`` follows it."""
        self._moved.add(t)
        loads[src] -= 1
        loads[dst] = loads.get(dst, 0) + 1
        return Move((t,), engine=dst)

    def steal(self, view: ClusterView, steps: range, ahead: int,
              leaving: frozenset[int] = frozenset(), stopped: frozenset[str] = frozenset()) -> list[Command]:
        """``steal``: engines that stay in rollout with nothing to do (consolidation kept
        them) each take the live trajectory predicted longest from the most crowded engine
        that holds at least ``_CROWDED``: the tail then spreads out, where decode is fastest.
        ``leaving``: engines sent out of rollout in this decision, which the view (unchanged
        while the policy decides) still lists as idle: they take nothing (a held split grew
        its trainer by an idle engine, then stealing moved a trajectory onto it, which the
        driver refused: 'Move to engine 0, which is not an active rollout engine'). An
        engine takes only a trajectory whose step its weights may generate (``ahead``
        versions behind the step at most): an engine back from a failure whose weight sync
        failed is idle, not syncing, and holds old weights (a stolen trajectory generated
        by them was trained two versions on at staleness 1: the fault sweep, 24 GPUs,
        seed 28). ``stopped``: trajectories this decision interrupts (``cut_stop``)."""
        loads = view.engine_loads()
        # an engine that took a trajectory is not idle again until that one is over: its
        # load shows the move only once the context has arrived, and two steals onto one
        # engine (one landing, one in flight) would pile the tail up again
        for e, t in list(self._stolen_to.items()):
            if view.trajectory(t).status not in _LIVE:
                del self._stolen_to[e]
        # (nothing crowded, the common case, is checked first: it needs no EngineInfo)
        if self._spread(loads)[1] < _CROWDED:
            return []
        idle = [e for e, load in loads
                if load == 0 and e not in self._stolen_to and e not in leaving and not view.engine(e).syncing]
        if not idle:
            return []
        by_engine: dict[int, list[tuple[float, str, int]]] = {}
        for st in steps:
            for rem, t, e in self._movable(view, st, stopped):
                by_engine.setdefault(e, []).append((rem, t, st))
        for kept in by_engine.values():
            kept.sort()
        load = dict(loads)
        out: list[Command] = []
        for e in idle:
            version = view.engine(e).version
            donors = [d for d in by_engine if load.get(d, 0) >= _CROWDED
                      and any(st - ahead <= version for _, _, st in by_engine[d])]
            if not donors:
                continue
            d = max(donors, key=lambda x: (load[x], -x))
            # the longest predicted of a step these weights may generate (ties: the highest id)
            i = max(i for i, (_, _, st) in enumerate(by_engine[d]) if st - ahead <= version)
            _, t, _ = by_engine[d].pop(i)
            self._stolen_to[e] = t
            out.append(self._move(t, d, e, load))  # (e, now at 1, is never a donor)
        return out

    def isolate(self, view: ClusterView, steps: range, queue: LateQueue, ahead: int,
                sent: Sequence[Command]) -> list[Command]:
        """``isolate``: a step in its tail (no more than ``_TAIL_PER_ENGINE`` unfinished
        trajectories per rollout engine) spreads them out: each, predicted longest first,
        moves once to the engine with the fewest live trajectories (holding weights recent
        enough for its step: ``ahead`` versions behind it at most), if it would share that
        one with fewer than its own (an engine's decode slows with every sequence and KV
        token it holds). ``sent``: the commands of this decision so far (engines leaving
        rollout take nothing; moves already made count)."""
        active = view.engine_loads()
        tail = [st for st in steps
                if not queue.pending(st) and 0 < view.unfinished(st) <= _TAIL_PER_ENGINE * len(active)]
        if not tail or len(active) < 2:
            return []  # (checked first: it is cheap, and most events are not in a tail)
        moves = [c for c in sent if isinstance(c, Move)]
        if moves:  # (moves made in this decision already count where they land)
            loads = dict(active)
            for c in moves:
                if c.engine in loads:
                    loads[c.engine] += len(c.trajectories)
            lowest, highest = min(loads.values()), max(loads.values())
        else:  # (the common case: the view's loads, whose spread is kept per tuple)
            lowest, highest = self._spread(active)
        # A trajectory on engine e moves only to a load + 1 < loads[e], and every load is at
        # least the lowest: an engine below lowest + 2 never sends one. Moves only narrow the
        # spread, so with none at lowest + 2 nothing moves (the common, balanced case: without
        # this check a seed-scale run, 2 trajectories per engine from the start, spent most of
        # its time ranking and scanning here). Checked over every engine first, before an
        # EngineInfo is built for each (that cost half the policy's time at seed scale): the
        # engines that may take part are some of them, so their spread is no wider.
        if highest < lowest + 2:
            return []
        # Engines leaving rollout in this decision drop out next, by id (no EngineInfo): an
        # engine sent to the trainer is usually the one idle engine that made the spread
        # (at seed scale ~99% of the calls that got past the check above stopped here once
        # the leaving engines were out, after building an EngineInfo for every engine).
        gone = {view.engine_of(g) for c in sent if isinstance(c, Reassign) for g in c.gpus}
        if moves:
            if gone:
                loads = {e: load for e, load in loads.items() if e not in gone}
                if len(loads) < 2 or max(loads.values()) < min(loads.values()) + 2:
                    return []
        elif gone:
            n, lo, hi = self._spread_without(active, _loads_of(active, gone))
            if n < 2 or hi < lo + 2:
                return []
            loads = {e: load for e, load in active if e not in gone}
        else:
            loads = dict(active)
        # (moved in this decision already, or interrupted by it: ``cut_stop`` -- moving one
        # was refused, 'Move of ... which is interrupted', under the fault sweep)
        moved = frozenset(t for c in sent if isinstance(c, (Move, Interrupt)) for t in c.trajectories)
        infos = {e: view.engine(e) for e in loads}
        loads = {e: load for e, load in loads.items() if not infos[e].syncing}
        if len(loads) < 2:
            return []
        lowest = min(loads.values())
        if max(loads.values()) < lowest + 2:
            return []
        out: list[Command] = []
        for st in tail:
            floor = st - ahead  # (the oldest weights the step may be generated by)
            for _, t, e in sorted(self._movable(view, st, moved), reverse=True):
                if e not in loads or loads[e] < lowest + 2:
                    continue  # (see above: no engine has room for it with fewer companions)
                cands = [(load, x) for x, load in loads.items() if x != e and infos[x].version >= floor]
                if not cands:
                    continue
                load, f = min(cands)
                if load + 1 >= loads[e]:
                    continue  # (no fewer companions there)
                out.append(self._move(t, e, f, loads))
                lowest = min(loads.values())
        return out

    def rebalance(self, view: ClusterView, steps: range, ahead: int,
                  sent: Sequence[Command] = ()) -> list[Command]:
        """``rebalance``: a trajectory of the rolling steps waiting in a KV-full engine's
        queue (its idle context evicted, or its turn preempted: it is prefilled again
        wherever it runs next) moves to the engine with the most free KV among those with
        no queue, weights recent enough for its step and room for twice its context (it
        fits, and its next turns grow there without evicting at once). Placement pins
        each trajectory to an engine; under KV pressure one engine's queue then waited
        while another had room (elastic bench, staleness 1: the growing preset 4.1% faster
        at 256 GPUs, 0.2% slower at 64, no other point moved; a small tp-2 cluster of the
        seed preset, ``tests/test_elastic_kv_pressure.py``, 7.8% faster). Only when some
        engine has a queue: the common case checks one sum. ``sent``: the commands of this
        decision so far, since the view does not change while the policy decides -- an
        engine a Reassign sends out of rollout takes and gives nothing (its drain moves its
        own work), one a Move lands on takes nothing more, and a trajectory already moved
        (``steal``) or interrupted (``cut_stop``) stays out. Like theirs, its moves are once
        per trajectory."""
        if not view.rollout_totals().engines_with_queue:
            return []
        leaving = {view.engine_of(g) for c in sent if isinstance(c, Reassign) for g in c.gpus}
        moved = {t for c in sent if isinstance(c, (Move, Interrupt)) for t in c.trajectories}
        landing = {c.engine for c in sent if isinstance(c, Move)}
        infos = {e: view.engine(e) for e in view.engines() if e not in leaving}
        full = {e for e, i in infos.items() if i.queued and not i.draining}  # (a leaving one's drain moves its own)
        free = {e: i.kv_capacity - i.kv_used for e, i in infos.items() if not i.queued and not i.draining
                and not i.syncing and i.kv_used < i.kv_capacity and e not in landing}
        if not full or not free:
            return []
        out: list[Command] = []
        for st in steps:
            floor = st - ahead  # (the oldest weights the step may be generated by)
            for t in view.batch(st):
                if view.status(t) is not TrajStatus.QUEUED:
                    continue
                i = view.trajectory(t)
                if not i.pinned or i.engine not in full or t in moved or t in self._moved:
                    continue
                room = [e for e, kv in free.items() if kv >= 2 * i.tokens and infos[e].version >= floor]
                if not room:
                    continue
                dest = max(room, key=lambda e: (free[e], -e))  # (the most free KV; ties: lowest id)
                free[dest] -= i.tokens
                self._moved.add(t)
                out.append(Move((t,), engine=dest))
        return out

