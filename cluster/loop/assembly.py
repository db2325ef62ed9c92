"""An engine of tp > 1 is assembled from GPUs that may finish their switch to rollout at
different times; the one rule both drivers follow for when it opens.

The GPUs of an engine can start their switches apart: one idle after a failure switches at
once, one in the trainer waits for the running job (``ClusterState.leave_train_later``),
and they may belong to different ``Reassign`` commands. The engine opens when its **last**
GPU lands, never its first: opened with the first, it served while the other half still
switched (and a policy, shown an engine, could send that half on -- an illegal ``Reassign``
found under GPU faults), or, when the other half was still in the trainer, neither half
ever formed it. A GPU whose partners are on their way waits, still ``SWITCHING``; one whose
partner is not coming (failed, or sent elsewhere) cannot form the engine and goes idle.

Pure bookkeeping: which GPUs wait and what each landing decides. The drivers do the rest
(opening the engine, roles, records, their switch groups' ``RolesChanged``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlsched.cluster.ids import Role
from rlsched.cluster.state import ClusterState

#: GPUs of one switch group that landed together, with the weights version their switch
#: started with.
Part = tuple[tuple[int, ...], int, int]


@dataclass(frozen=True, slots=True)
class Formed:
    """Engine ``engine`` is decided: every GPU landed (``opens``), or a GPU of it is not
    coming, so the ``parts`` landed (those waiting and this landing's) go idle."""

    engine: int
    opens: bool
    parts: tuple[Part, ...]

    @property
    def version(self) -> int:
        """The weights the engine serves: loaded as it starts, which is when its last GPU's
        switch started -- the newest version any part took."""
        return max(v for _, _, v in self.parts)


class Assembly:
    """GPUs landed in rollout that wait for the rest of their engine."""

    def __init__(self) -> None:
        self.waiting: dict[int, list[Part]] = {}  # engine -> parts landed, waiting

    def land(self, st: ClusterState, gpus: tuple[int, ...], gid: int, version: int,
             switching_to: Callable[[int], Role | None]) -> list[Formed]:
        """GPUs ``gpus`` of switch group ``gid`` finished switching to rollout. Returns, per
        engine they belong to (in engine order), what is decided now; an engine whose other
        GPUs are on their way (``switching_to`` them is ROLLOUT, or they wait to leave the
        trainer for rollout) is not in the list: these GPUs wait for them."""
        out: list[Formed] = []
        by_engine: dict[int, list[int]] = {}  # (one pass: a filter per engine was quadratic
        for g in gpus:                         # in the GPUs landing, minutes at 65k GPUs)
            by_engine.setdefault(st.engine_of(g), []).append(g)
        for e in sorted(by_engine):
            mine = tuple(by_engine[e])
            held = set(mine).union(*(gs for gs, _, _ in self.waiting.get(e, ())))
            others = [x for x in st.engine_gpus(e) if x not in held and st.roles[x] is not Role.ROLLOUT]
            if others and all(_coming(st, x, switching_to) for x in others):
                self.waiting.setdefault(e, []).append((mine, gid, version))
                continue
            out.append(Formed(e, not others, ((mine, gid, version), *self.waiting.pop(e, ()))))
        return out

    def lost(self, st: ClusterState, gpu: int) -> tuple[Part, ...]:
        """GPU ``gpu`` will not join its engine (it failed, or landed in another role): the
        parts of its engine waiting for it, without ``gpu`` itself (a failed GPU that was
        waiting), which now go idle."""
        if not self.waiting:
            return ()
        parts = self.waiting.pop(st.engine_of(gpu), ())
        trimmed = ((tuple(g for g in gs if g != gpu), gid, v) for gs, gid, v in parts)
        return tuple(p for p in trimmed if p[0])


def _coming(st: ClusterState, g: int, switching_to: Callable[[int], Role | None]) -> bool:
    if switching_to(g) is Role.ROLLOUT:
        return True
    leaving = st.leaving_train.get(g)
    return leaving is not None and leaving[1] is Role.ROLLOUT
