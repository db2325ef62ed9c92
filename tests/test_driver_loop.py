"""The driver loop's own logic (``rlsched.cluster.loop``), above a fake backend: the trainer
queue's bookkeeping and step rows, the one record mapping, the run meta's keys. (Both real
backends run it in every simulator test and in tests/live/test_backend_conformance.py.)"""

from __future__ import annotations

import pytest

from rlsched.cluster.commands import Drop, OptimizerStep, SetTimer, Train, TrainMicroBatch
from rlsched.cluster.errors import PolicyError
from rlsched.cluster.events import MicroBatchFinished, RunStarted, TrainStepFinished, WorkerFailed
from rlsched.cluster.ids import TrajStatus
from rlsched.cluster.loop import DriverLoop, MicroBatchJob, RunMeta, TrainerJob, record_event
from rlsched.cluster.state import ClusterState

from simkit import two_engines


class FakeBackend:
    """A fake backend for these tests: jobs finish when the test says so; it logs calls."""

    def __init__(self) -> None:
        self.clock = 0.0
        self.started: list[TrainerJob] = []
        self.calls: list[tuple] = []

    def now(self) -> float:
        return self.clock

    def trainer_ready(self) -> bool:
        return True

    def start_job(self, job: TrainerJob) -> None:
        self.started.append(job)

    def trained_tokens(self, tids: list[str]) -> int:
        return 10 * len(tids)

    def step_finished(self, trained: list[str]) -> None:
        self.calls.append(("step_finished", tuple(trained)))

    def job_released(self) -> None:
        self.calls.append(("job_released",))

    def drop(self, trajectories) -> None:
        self.calls.append(("drop", tuple(trajectories)))

    def set_timer(self, at: float, tag: str) -> None:
        self.calls.append(("set_timer", at, tag))


class ScriptedPolicy:
    """A fake policy: answers RunStarted with a fixed list of commands."""

    name = "scripted"
    params = ()
    max_staleness = 1
    defers = False

    def __init__(self, commands) -> None:
        self.commands = commands
        self.seen: list = []

    def reset(self, view, rng) -> None:
        pass

    def on_event(self, event, view):
        self.seen.append(event)
        return self.commands if isinstance(event, RunStarted) else []


class Rows:
    """Collects run-record rows (the EventSink call)."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []

    def event(self, time, kind, **kw) -> None:
        self.rows.append((time, kind, kw))


def _state() -> ClusterState:
    st = ClusterState(2, 1, [[("a", "t"), ("b", "t"), ("c", "t")]], 1)
    st.advance(0.0)
    for tid in ("a", "b", "c"):
        st.mark_finished(tid, TrajStatus.DONE)
    return st


def test_the_trainer_queue_runs_jobs_in_order_and_writes_the_step_row() -> None:
    st = _state()
    st.trajs["a"].min_version = 0
    st.trajs["b"].min_version = -1  # cut before its first turn: no staleness
    progress: list[tuple] = []
    backend = FakeBackend()
    loop = DriverLoop(st, ScriptedPolicy([TrainMicroBatch(("a",)), Train(("b", "c"))]), backend, Rows(),
                      progress=lambda *a: progress.append(a))
    st.trajs["c"].min_version = 0
    loop.emit(RunStarted())
    loop.pump()
    tq = loop.trainer
    assert (st.queued_micro_batches, st.queued_optimizer_steps, st.trainer_busy) == (1, 1, True)
    assert backend.started == [MicroBatchJob(("a",))] and len(tq.jobs) == 2
    tq.job_finished(backend.started[-1], 1.5)
    assert st.accumulated == ["a"] and loop.events[-1] == MicroBatchFinished(("a",))
    assert backend.started[-1] == MicroBatchJob(("b", "c"))
    tq.job_finished(backend.started[-1], 2.0)
    backend.clock = 7.0
    tq.job_finished(backend.started[-1], 0.5)  # the optimizer step
    assert st.version == 1 and loop.events[-1] == TrainStepFinished(1)
    assert tq.steps == [{"version": 1, "time": 7.0, "trajectories": 3, "trained_tokens": 30,
                         "train_seconds": 4.0, "max_staleness": 0}]
    assert (st.queued_micro_batches, st.queued_optimizer_steps, st.trainer_busy, st.accumulated) == (0, 0, False, [])
    assert all(st.trajs[t].status is TrajStatus.TRAINED for t in "abc")
    assert progress == [(1, 1, 7.0)]
    assert ("step_finished", ("a", "b", "c")) in backend.calls


def test_a_requeued_step_runs_again_from_its_first_micro_batch() -> None:
    st = _state()
    backend = FakeBackend()
    loop = DriverLoop(st, ScriptedPolicy([TrainMicroBatch(("a",)), TrainMicroBatch(("b",)), OptimizerStep()]),
                      backend, None)
    loop.emit(RunStarted())
    loop.pump()
    tq = loop.trainer
    first = backend.started[-1]
    tq.job_finished(first, 1.0)  # "b" is running now
    tq.requeue(2.0, [first])
    assert list(tq.jobs)[:2] == [first, MicroBatchJob(("b",))]
    assert (st.queued_micro_batches, st.trainer_busy, st.accumulated, tq.step_seconds) == (2, False, [], 3.0)


def test_drop_and_timers_reach_the_backend_and_the_state() -> None:
    st = _state()
    backend = FakeBackend()
    rows = Rows()
    loop = DriverLoop(st, ScriptedPolicy([Drop(("c",)), SetTimer(5.0, "x")]), backend, rows)
    loop.emit(RunStarted())
    loop.pump()
    assert backend.calls == [("drop", ("c",)), ("set_timer", 5.0, "x")]
    assert st.trajs["c"].status is TrajStatus.DROPPED
    assert [r[1] for r in rows.rows] == ["RunStarted", "Drop", "SetTimer"]
    assert loop.pumped == 1


def test_an_unknown_command_is_refused_in_one_line() -> None:
    loop = DriverLoop(_state(), ScriptedPolicy([]), FakeBackend(), None)
    with pytest.raises(PolicyError, match=r"^unknown command") as err:
        loop.apply(object())  # type: ignore[arg-type]
    assert "\n" not in str(err.value)


def test_one_record_text_for_both_drivers() -> None:
    rows = Rows()
    record_event(rows, 1.0, WorkerFailed(3, ("a", "b")), _state())
    assert rows.rows == [(1.0, "WorkerFailed", {"gpu": 3, "detail": "2 trajectories interrupted"})]


def test_run_meta_writes_the_record_format_keys_in_order() -> None:
    meta = RunMeta(driver="sim", policy="p", policy_name="p", num_gpus=2, tp=1, num_steps=1, steps_done=1,
                   complete=True, makespan_seconds=1.0, lower_bound_seconds=0.5, max_staleness_bound=0,
                   seed=0, config={}, events_processed=3, driver_fields={"cost_model": {}},
                   extra={"note": "x"})
    assert list(meta.to_dict()) == [
        "driver", "policy", "policy_name", "num_gpus", "tp", "num_steps", "steps_done", "complete",
        "makespan_seconds", "lower_bound_seconds", "max_staleness_bound", "seed", "config", "cost_model",
        "events_processed", "note"]
    with_faults = RunMeta(**{**meta.__dict__, "faults": {"gpu": 1}, "fault_schedule": {}}).to_dict()
    assert list(with_faults)[-3:] == ["faults", "fault_schedule", "note"]


def test_the_loop_refuses_a_train_off_its_step_unless_the_policy_defers() -> None:
    # (the step promise, checked in the loop both drivers share: before the command is
    # recorded or applied)
    def two_steps() -> ClusterState:
        st = ClusterState(2, 1, [[("a", "t")], [("b", "t")]], 1)
        st.mark_finished("b", TrajStatus.DONE)
        st.trajs["b"].min_version = 0
        return st

    st, rows, backend = two_steps(), Rows(), FakeBackend()
    loop = DriverLoop(st, ScriptedPolicy([Train(("b",))]), backend, rows)
    loop.emit(RunStarted())
    with pytest.raises(PolicyError, match=r"^training 'b' of step 1 at version 0: a policy that does not defer"):
        loop.pump()
    assert backend.started == [] and not any(kind == "Train" for _, kind, _ in rows.rows)

    class Deferring(ScriptedPolicy):
        defers = True

    st, backend = two_steps(), FakeBackend()
    loop = DriverLoop(st, Deferring([Train(("b",))]), backend, Rows())
    loop.emit(RunStarted())
    loop.pump()
    assert backend.started == [MicroBatchJob(("b",))]


class FinishingBackend(FakeBackend):
    """Moving "a" admits "b" at the head of its engine's queue, whose next turn fits on no
    engine: it times out at once (the simulator's ``_admit``), inside the Move's application."""

    def __init__(self, st: ClusterState) -> None:
        super().__init__()
        self.st = st

    def move(self, tids, engine) -> None:
        self.calls.append(("move", tuple(tids), engine))
        if "a" in tids:
            self.st.mark_finished("b", TrajStatus.TIMED_OUT)

    def interrupt(self, tid, keep) -> None:
        self.calls.append(("interrupt", tid))


def _rolling_out() -> ClusterState:
    return two_engines([("a", "t"), ("b", "t"), ("c", "t")], max_staleness=1)


def test_a_trajectory_an_earlier_command_of_the_decision_finished_is_left_out() -> None:
    """Found by a fault sweep with a tight KV cache (12 single-GPU engines): elastic moved one
    trajectory off a full engine, which admitted the next in its queue, too long for any
    engine -- timed out on the spot -- and the same decision's next Move named it: 'Move of
    ... which is timed_out, not queued or running'. The policy decided on the view before
    either command; the loop now leaves it out of later Moves and Interrupts."""
    from rlsched.cluster.commands import Interrupt, Move

    st = _rolling_out()
    backend = FinishingBackend(st)
    policy = ScriptedPolicy([Move(("a",), 1), Move(("b",), 1), Interrupt(("b", "c"), keep_progress=True)])
    loop = DriverLoop(st, policy, backend, None)
    loop.emit(RunStarted())
    loop.pump()
    assert backend.calls == [("move", ("a",), 1), ("interrupt", "c")]


def test_moving_a_trajectory_finished_before_the_decision_is_still_the_policys_error() -> None:
    from rlsched.cluster.commands import Move

    st = _rolling_out()
    st.mark_finished("b", TrajStatus.TIMED_OUT)
    loop = DriverLoop(st, ScriptedPolicy([Move(("b",), 1)]), FinishingBackend(st), None)
    loop.emit(RunStarted())
    with pytest.raises(PolicyError, match="timed_out, not queued or running"):
        loop.pump()
