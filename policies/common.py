"""Small helpers shared by the shipped policies (pure functions of the view)."""

from __future__ import annotations

from rlsched.cluster.view import ClusterView


def all_gpus(view: ClusterView) -> tuple[int, ...]:
    return tuple(range(view.num_gpus))


def engine_split(view: ClusterView, rollout_fraction: float) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Split the cluster into (rollout GPUs, train GPUs) on engine boundaries.

    At least one engine goes to each side; the rollout share is rounded to whole engines.
    """
    engines = view.num_gpus // view.tp
    r = min(engines - 1, max(1, round(engines * rollout_fraction)))
    cut = r * view.tp
    return tuple(range(cut)), tuple(range(cut, view.num_gpus))
