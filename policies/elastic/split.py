"""Sizing rules for elastic's split between rollout and training, as pure arithmetic on
what the policy knows when it decides (no view, no commands), so each rule can be read,
tested and argued on its own: how much of the queued work the engines already up take
while others are on their way to rollout (:func:`share_while_coming`), and the trainer's
side of a split held because no move between the roles can pay (:func:`held_trainer_gpus`).
"""

from __future__ import annotations

import math

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


def at_trainer_floor(gpus: int, floor: int, tp: int, most: int) -> int:
    """``gpus`` for the trainer lifted to its memory ``floor`` (a trainer below it runs
    nothing) in whole engines of ``tp``, or 0 when that is more than ``most`` (no room left
    to roll out): the one rule for the reserved trainer and the held side."""
    if gpus < floor:
        gpus = math.ceil(floor / tp) * tp
    return 0 if gpus > most else gpus


def held_trainer_gpus(step_gpu_s: float, switch_s: float, gpus: int, tp: int, floor: int) -> int:
    """``hold``: the GPUs of the trainer's side of a fixed split to hold, or 0 when moving
    GPUs between the roles can pay. ``step_gpu_s``: the last step's training at the
    measured GPU-seconds per token; ``switch_s``: a role switch, measured; ``gpus`` in
    engines of ``tp``; ``floor``: the trainer's memory floor.

    The side: half the engines, rounded **up** (at least the floor, and at least one engine
    left to roll out). Why up: with no length spread, a step's rollout is the latency of its
    trajectories rather than its GPUs, and of async's splits the fastest left at most half
    the engines rolling out in 79 of 80 random ``uniform`` cases (2 to 8 engines, session
    13); on 3 engines the trainer's two of them were fastest in 12 of 13, where the half
    rounded down (one) put elastic up to 6.9% behind the best async (seed 861126: now 1.7%
    ahead). A split balancing the two sides instead (the trainer's step in about a batch's
    measured rollout; tried in session 13) was up to 24% behind on the same cases, 31 of 80
    over 1% against 21 with the half: at staleness 1 the trainer's step and the next
    rollout run one after the other, so what a trainer engine saves counts in full, and the
    rollout, latency-bound, loses little per engine.

    When: a move from the held side to every GPU saves at most ``step_gpu_s / side -
    step_gpu_s / all`` seconds of the step's training, and costs a switch there and a switch
    back; when the saving is no more than the two switches, no move can repay itself and the
    split holds. (Until session 13 the test was the whole of ``step_gpu_s / side``, which
    counted as saved the training that the held side does anyway: it engaged on fewer
    light-step workloads than this bound allows.)"""
    engines = gpus // tp
    if engines < 2 or switch_s < 0 or step_gpu_s < 0:
        return 0
    side = at_trainer_floor((engines + 1) // 2 * tp, floor, tp, (engines - 1) * tp)
    if not side:
        return 0  # no room for both sides: nothing to hold
    saving = step_gpu_s / side - step_gpu_s / (engines * tp)
    return side if saving <= 2.0 * switch_s else 0
