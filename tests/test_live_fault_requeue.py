"""The live trainer queue after a ``[faults]`` trainer crash (issue #22 item 4), without Ray.

``Training.abort_step`` must re-queue the step's finished micro-batches and the running job
in their order, ahead of work queued after them, as the simulator does
(``sim/faults._abort_step``), and drop the late reply of the job that ran on the crashed
trainer. The trainer lane here is a fake (it hands out futures the test completes); the
queue logic above it is the real one. The crash itself (killed ranks, a restarted lane) is
exercised live in tests/live/test_live_fault_kinds.py.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from rlsched.cluster.ids import Role
from rlsched.cluster.loop.trainer_queue import MicroBatchJob, TrainerQueue
from rlsched.cluster.state import ClusterState
from rlsched.real.loop.training import Training
from rlsched.real.rollout.agent_loop import AgentTrajectory


class FakeLane:
    """Hands out one future per job, in order; the test completes them."""

    processor = False  # (the trajectory processor: off)

    def __init__(self) -> None:
        self.jobs: list[tuple[str, Future]] = []

    def micro_batch(self, samples: list) -> Future:
        self.jobs.append(("micro", Future()))
        return self.jobs[-1][1]

    def optimizer_step(self) -> Future:
        self.jobs.append(("optimizer", Future()))
        return self.jobs[-1][1]


class FakeTrainerBackend:
    """The live backend's trainer half, as ``real/loop/backend.py`` wires it to ``Training``."""

    def __init__(self, host: FakeHost) -> None:
        self.h = host

    def now(self) -> float:
        return self.h.now()

    def trainer_ready(self) -> bool:
        return self.h.training.ready()

    def start_job(self, job: Any) -> None:
        self.h.training.start_job(job)

    def trained_tokens(self, tids: list[str]) -> int:
        return 0

    def step_finished(self, trained: list[str]) -> None:
        pass

    def job_released(self) -> None:
        pass


class FakeLoop:
    def __init__(self, trainer: TrainerQueue) -> None:
        self.trainer = trainer


class FakeHost:
    """The few driver attributes ``Training`` reads (the trainer queue above it is the
    driver loop's real one); callbacks run when the test says."""

    def __init__(self) -> None:
        self.st = ClusterState(2, 1, [[("a", "t"), ("b", "t"), ("c", "t")]], 1)
        self.st.roles[1] = Role.TRAIN
        self.trajs = {t: AgentTrajectory(t, "t", 0, seed=0) for t in "abc"}
        self.lane = FakeLane()
        self.timeline = self
        self.roles = self
        self.lane_ops = 0
        self.faults = None
        self.stats: dict[str, list] = {"micro_batch": [], "optimizer": []}
        self.calls: list[tuple[Future, Any]] = []
        self.events: list[Any] = []
        self.training = Training(self)  # type: ignore[arg-type]
        self.loop = FakeLoop(TrainerQueue(self.st, FakeTrainerBackend(self), self.emit))

    def now(self) -> float:
        return 1.0

    def set(self, *_: Any, **__: Any) -> None:  # timeline
        pass

    def release_leaving(self) -> None:  # roles
        pass

    def submit(self, fut: Future, cb: Any) -> None:
        self.calls.append((fut, cb))

    def emit(self, ev: Any) -> None:
        self.events.append(ev)

    def deliver(self, k: int, value: Any) -> None:
        """The lane's k-th job returns ``value``; its callback runs as the loop would run it."""
        self.lane.jobs[k][1].set_result(value)
        fut, cb = self.calls[k]
        cb(fut.result())


def _queued(h: FakeHost) -> list[tuple[str, tuple[str, ...]]]:
    return [("micro", j.trajectories) if isinstance(j, MicroBatchJob) else ("optimizer", ())
            for j in h.loop.trainer.jobs]


def test_a_crash_requeues_the_steps_micro_batches_in_order_and_voids_the_running_job() -> None:
    h = FakeHost()
    tr, q = h.training, h.loop.trainer
    q.micro_batch(("a",))
    q.micro_batch(("b",))
    q.optimizer_step()
    tr.next_job()  # micro a runs
    h.deliver(0, {"seconds": 2.0})  # a done; micro b starts
    assert [type(e).__name__ for e in h.events] == ["MicroBatchFinished"] and tr.job_running
    q.micro_batch(("c",))  # queued after the running job
    lost = tr.abort_step()
    assert lost == 2.0 + 0.0  # a's 2 s on one GPU, b ran 0 s (the fake clock stands still)
    assert _queued(h) == [("micro", ("a",)), ("micro", ("b",)), ("optimizer", ()), ("micro", ("c",))]
    assert h.st.queued_micro_batches == 3 and h.st.accumulated == [] and not tr.job_running
    h.deliver(1, {"seconds": 5.0})  # b's late reply from the crashed trainer: void
    assert len(h.events) == 1 and h.stats["micro_batch"] == [{"seconds": 2.0}]
    tr.next_job()  # the re-run starts with a, on the restarted trainer
    assert h.lane.jobs[-1][0] == "micro" and _queued(h)[0] == ("micro", ("b",))
    h.deliver(2, {"seconds": 1.0})
    assert h.st.accumulated == ["a"]
