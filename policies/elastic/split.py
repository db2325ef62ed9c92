"""Sizing rules for elastic's split between rollout and training, as pure arithmetic on
what the policy knows when it decides (no view, no commands), so each rule can be read,
tested and argued on its own. Today: how much of the queued work the engines already up
take while others are on their way to rollout (:func:`share_while_coming`).
"""

from __future__ import annotations

from ..placement import per_engine_cap


def share_while_coming(cap: int, in_flight: int, up: int, coming: int, pack: float) -> int:
    """The per-engine cap while ``coming`` engines are on their way to rollout (taken back
    from the trainer for a new batch) and ``up`` roll out already: their share -- ``pack``
    times an even spread of the ``in_flight`` trajectories (live on engines, or queued to be
    placed) over the ``up + coming`` engines --, and never more than the steady-state
    ``cap`` (``pack`` times an even spread of k+1 batches over every engine).

    Why: placement is bound at dispatch, so what the engines up take now they keep. The
    steady-state cap counts k+1 batches over every engine; when less is in flight -- a
    staleness-1 run's last batch, released after the one before it finished -- it let the
    one engine up take nearly the whole batch while the engine coming back got the rest,
    one trajectory, and went back to the trainer (tool-heavy, 3 single-GPU engines, 3 steps
    of 48 trajectories: 47 on one engine, 5.0% behind the best fixed split; with the share,
    13.8% ahead). It is measured, not predicted: it counts the engines actually coming and
    the work actually in flight, so no trajectory waits for an engine that is not on its
    way (a cap from a predicted end-of-run spread instead, with the engines taken back
    sized as before, put a tool-heavy 8-engine case 1.5% behind the best async, from 1.7%
    ahead; this rule: 2.0% ahead)."""
    if up + coming <= 0:
        return cap
    return min(cap, per_engine_cap(in_flight, up + coming, pack))
