"""GpuStates: the trainer's fast path (set_runs, with the trainer's GPUs owning their
state as one group) records the same per-GPU intervals as writing every GPU with set()."""

from __future__ import annotations

import random

import pytest

from rlsched.cluster.ids import GpuState
from rlsched.sim.gpus import GpuStates
from rlsched.sim.trainer import runs_of as trainer_runs

N = 16


class FakeRecorder:
    """Collects GpuStates' intervals (only ``interval`` is called on it)."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []

    def interval(self, first: int, count: int, start: float, end: float, state: str, step: int = -1) -> None:
        if end > start:
            self.rows.append((first, count, start, end, state, step))

    def intervals(self, firsts, counts, start: float, end: float, state: str, step: int = -1) -> None:
        for first, count in zip(firsts, counts, strict=True):
            self.interval(first, count, start, end, state, step)


def per_gpu(rows: list[tuple]) -> list[tuple]:
    """Intervals per GPU, adjacent pieces of one state and step joined."""
    out: dict[int, list[list]] = {}
    for first, count, start, end, state, step in sorted(rows, key=lambda r: (r[2], r[0])):
        for g in range(first, first + count):
            lst = out.setdefault(g, [])
            if lst and lst[-1][1] == start and lst[-1][2:] == [state, step]:
                lst[-1][1] = end
            else:
                lst.append([start, end, state, step])
    return sorted((g, *iv) for g, ivs in out.items() for iv in ivs)


def runs_of(gpus: list[int]) -> tuple[tuple[int, int], ...]:
    runs: list[tuple[int, int]] = []
    for g in gpus:
        if runs and sum(runs[-1]) == g:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((g, 1))
    return tuple(runs)


@pytest.mark.parametrize("seed", range(12))
def test_set_runs_records_what_set_records(seed):
    rng = random.Random(seed)
    fast, slow = FakeRecorder(), FakeRecorder()
    a, b = GpuStates(N, fast), GpuStates(N, slow)  # type: ignore[arg-type]
    trainer = sorted(rng.sample(range(N), 8))
    runs = runs_of(trainer)
    now = 0.0
    for _ in range(300):
        now += rng.choice([0.0, 0.5, 1.0])
        op = rng.random()
        if op < 0.6:  # the trainer's GPUs change state (micro-batch start or end)
            state = rng.choice([GpuState.TRAIN, GpuState.TRAIN_IDLE])
            step = rng.randrange(3) if state is GpuState.TRAIN else -1
            a.set_runs(runs, state, now, step)
            b.set(trainer, state, now, step)
        elif op < 0.8:  # someone else writes some GPUs (a switch, a failure)
            gpus = rng.sample(range(N), rng.randint(1, 4))
            state = rng.choice([GpuState.SWITCH, GpuState.FAILED, GpuState.TRAIN_IDLE])
            a.set(gpus, state, now)
            b.set(gpus, state, now)
        elif op < 0.85:  # the trainer's set changes
            trainer = sorted(rng.sample(range(N), rng.randint(1, 12)))
            runs = runs_of(trainer)
        elif op < 0.9:  # the trainer grows (an engine's GPUs join it, as in elastic's tail)
            others = [g for g in range(N) if g not in trainer]
            if others:
                joining = rng.sample(others, rng.randint(1, min(3, len(others))))
                a.set(joining, GpuState.TRAIN_IDLE, now)
                b.set(joining, GpuState.TRAIN_IDLE, now)
                trainer = sorted(trainer + joining)
                runs = runs_of(trainer)
        else:  # someone reads a GPU
            g = rng.randrange(N)
            assert a.state_of(g) == b.state_of(g)
    a.close_all(now + 1)
    b.close_all(now + 1)
    assert per_gpu(fast.rows) == per_gpu(slow.rows)
    assert a.busy_seconds == pytest.approx(b.busy_seconds)
    assert sum(r[1] for r in fast.rows) <= sum(r[1] for r in slow.rows)  # (never more rows)


def test_trainer_runs_are_the_consecutive_runs_of_its_gpus():
    rng = random.Random(0)
    for _ in range(200):
        gpus = sorted(rng.sample(range(64), rng.randint(0, 64)))
        assert trainer_runs(tuple(gpus)) == runs_of(gpus)


def test_a_trainer_change_writes_one_row_per_run():
    rec = FakeRecorder()
    g = GpuStates(N, rec)  # type: ignore[arg-type]
    runs = ((0, 2), (4, 2))
    g.set_runs(runs, GpuState.TRAIN_IDLE, 0.0)
    g.set_runs(runs, GpuState.TRAIN, 1.0, step=0)
    g.set_runs(runs, GpuState.TRAIN_IDLE, 3.0)
    g.close_all(4.0)
    mine = sorted(r for r in rec.rows if r[0] in (0, 4))
    assert mine == [(0, 2, 0.0, 1.0, "train_idle", -1), (0, 2, 1.0, 3.0, "train", 0),
                    (0, 2, 3.0, 4.0, "train_idle", -1), (4, 2, 0.0, 1.0, "train_idle", -1),
                    (4, 2, 1.0, 3.0, "train", 0), (4, 2, 3.0, 4.0, "train_idle", -1)]
    assert g.busy_seconds == pytest.approx({"train": 4 * 2.0, "train_idle": 4 * 2.0, "idle": 12 * 4.0})
