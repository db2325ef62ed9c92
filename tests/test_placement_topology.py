"""Node-local choices in ``policies/placement.py``: which engines go to the trainer and which
trainer GPUs come back, with NVLink domains in the view (and unchanged orders without),
on a fake view that answers only what these helpers read."""

from __future__ import annotations

from rlsched.cluster.view import TrainerInfo
from rlsched.policies.placement import from_trainer_order, to_trainer_order


class FakeTopologyView:
    """A fake ClusterView: ``gpus`` GPUs in engines of ``tp``, domains of ``per_node``
    GPUs, the trainer on ``trainer`` (only the methods the helpers call)."""

    def __init__(self, gpus: int, tp: int, per_node: int, trainer: tuple[int, ...]) -> None:
        self.num_gpus, self.tp, self.gpus_per_node = gpus, tp, per_node
        self._trainer = trainer

    def engine_of(self, gpu: int) -> int:
        return gpu // self.tp

    def engine_gpus(self, engine: int) -> tuple[int, ...]:
        return tuple(range(engine * self.tp, (engine + 1) * self.tp))

    def trainer(self) -> TrainerInfo:
        return TrainerInfo(self._trainer, 0, False, 0, 0, 0)


def test_flat_fabric_keeps_the_old_orders() -> None:
    v = FakeTopologyView(16, 2, 0, trainer=(0, 1))
    loads = [(e, load) for e, load in enumerate([0, 1, 0, 0, 2, 0, 1, 0])]
    # least loaded first, ties by the highest id
    assert to_trainer_order(v, loads) == [7, 5, 3, 2, 0, 6, 1, 4]
    assert from_trainer_order(v, tuple(range(8)), 4) == (4, 5, 6, 7)
    assert from_trainer_order(v, tuple(range(8)), 8) == tuple(range(8))
    assert from_trainer_order(v, tuple(range(8)), 0) == ()


def test_engines_next_to_the_trainer_go_to_it_first() -> None:
    # 16 GPUs, tp 2, domains of 4 GPUs (2 engines each); the trainer holds GPUs 0-1
    # (domain 0): of the idle engines 1 (domain 0), 2, 3 (domain 1), 5 (domain 2), 7
    # (domain 3), engine 1 goes first; then the domain both of whose engines are free
    # (1: engines 2, 3) as a whole; then the highest id; a loaded engine stays last
    v = FakeTopologyView(16, 2, 4, trainer=(0, 1))
    loads = [(1, 0), (2, 0), (3, 0), (4, 1), (5, 0), (7, 0)]
    assert to_trainer_order(v, loads) == [1, 3, 2, 7, 5, 4]


def test_without_a_trainer_whole_domains_go_together() -> None:
    v = FakeTopologyView(16, 2, 4, trainer=())
    loads = [(0, 0), (2, 0), (3, 0), (4, 0), (7, 0)]
    # domain 1 (engines 2, 3) is free as a whole; then the highest ids
    assert to_trainer_order(v, loads)[:2] == [3, 2]


def test_gpus_come_back_from_the_domains_the_trainer_barely_holds() -> None:
    # domains of 4; the trainer holds 0-3 (all of domain 0), 4-5 (half of domain 1) and
    # 8-11 (domain 2): giving 2 GPUs back takes domain 1's engine, leaving whole domains
    # (the flat order would have taken 10-11 and split domain 2)
    gpus = (0, 1, 2, 3, 4, 5, 8, 9, 10, 11)
    v = FakeTopologyView(16, 2, 4, trainer=gpus)
    assert from_trainer_order(v, gpus, 2) == (4, 5)
    # 6 GPUs: domain 1's engine, then a whole domain (the highest: 2)
    assert from_trainer_order(v, gpus, 6) == (4, 5, 8, 9, 10, 11)


def test_a_count_that_cuts_engines_is_still_met() -> None:
    gpus = (0, 1, 2, 3, 4, 5)
    v = FakeTopologyView(8, 2, 4, trainer=gpus)
    out = from_trainer_order(v, gpus, 3)
    assert len(out) == 3 and set(out) <= set(gpus) and {4, 5} <= set(out)
    # a trainer GPU whose engine partner is elsewhere (a failure) is not a whole engine
    v2 = FakeTopologyView(8, 2, 4, trainer=(0, 1, 2))
    assert from_trainer_order(v2, (0, 1, 2), 2) == (0, 1)
