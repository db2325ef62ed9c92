"""GRPO advantages of streamed micro-batches (issue #25): a trajectory sent to the trainer
before the rest of its group finished is trained with the whole group's baseline
(``real/train/samples.py``), not one over the members finished so far.

Before the fix the live trainer normalised each micro-batch over the group members settled
at that moment: streaming a 4-member group one trajectory at a time (rewards 0, 0, 1, 1 in
finishing order) gave advantages 0, 0, +1.41, +1 instead of the group's -1, -1, +1, +1."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlsched.cluster.ids import TrajStatus
from rlsched.real.rollout.agent_loop import AgentTrajectory
from rlsched.real.train.grpo import grpo_samples
from rlsched.real.train.samples import GroupHold, micro_batch_samples


@dataclass
class FakeTrajState:
    status: TrajStatus


@dataclass
class FakeState:
    """The two things the sample builder reads from ClusterState."""

    version: int = 0
    trajs: dict[str, FakeTrajState] = field(default_factory=dict)


def _group(task: str, rewards: list[float], step: int = 0) -> dict[str, AgentTrajectory]:
    out = {}
    for i, r in enumerate(rewards):
        t = AgentTrajectory(tid=f"s{step}-{task}-{i}", task_id=task, step=step, seed=i)
        t.token_ids, t.loss_mask = [1, 2, 3 + i], [0, 1, 1]
        t.behaviour_logprobs, t.token_versions = [float("nan"), -0.5, -0.5], [-1, 0, 0]
        t.reward = r
        out[t.tid] = t
    return out


def _stream(trajs, st, order, *, hold: GroupHold | None):
    """Finish and send the trajectories one at a time, as elastic streams them; returns
    {tid: advantage trained}."""
    trained = {}
    for tid in order:
        st.trajs[tid].status = TrajStatus.DONE
        samples = (hold.take(trajs, st, [tid])[0] if hold is not None
                   else micro_batch_samples(trajs, st, [tid])[0])
        for s in samples:
            trained[s.token_ids[-1]] = s.advantage
    if hold is not None:
        for s in hold.flush(trajs, st):
            trained[s.token_ids[-1]] = s.advantage
    return trained


def _setup(rewards):
    trajs = _group("a", rewards)
    st = FakeState(trajs={t: FakeTrajState(TrajStatus.RUNNING) for t in trajs})
    full = {t.token_ids[-1]: s.advantage for t, s in zip(trajs.values(), grpo_samples(list(trajs.values())), strict=True)}
    return trajs, st, full


def test_streamed_group_is_trained_with_the_whole_groups_advantages() -> None:
    trajs, st, full = _setup([0.0, 0.0, 1.0, 1.0])
    hold = GroupHold()
    trained = _stream(trajs, st, ["s0-a-1", "s0-a-0", "s0-a-3", "s0-a-2"], hold=hold)
    assert trained == full  # every member once, each with the full group's advantage
    assert not hold.held


def test_per_micro_batch_baseline_differs_from_the_groups() -> None:
    # what the trainer did before: the first finisher alone has advantage 0, the next
    # ones are normalised over early finishers only
    trajs, st, full = _setup([0.0, 0.0, 1.0, 1.0])
    trained = _stream(trajs, st, ["s0-a-1", "s0-a-0", "s0-a-3", "s0-a-2"], hold=None)
    assert trained[4] == trained[3] == 0.0 and full[4] == full[3] < 0
    assert abs(trained[6] - 2 ** 0.5) < 1e-4 and trained != full


def test_members_wait_and_the_tokens_are_charged_when_sent() -> None:
    trajs, st, _ = _setup([0.0, 1.0, 1.0])
    hold = GroupHold()
    st.trajs["s0-a-0"].status = TrajStatus.DONE
    samples, tokens = hold.take(trajs, st, ["s0-a-0"])
    assert samples == [] and tokens == {"s0-a-0": 3} and hold.held == ("s0-a-0",)


def test_flush_trains_what_waits_with_the_members_settled_so_far() -> None:
    # a member that cannot finish before the optimizer step (cut into the next step):
    # the held ones are trained at the step, over the settled members
    trajs, st, _ = _setup([0.0, 1.0, 1.0])
    hold = GroupHold()
    for tid in ("s0-a-0", "s0-a-1"):
        st.trajs[tid].status = TrajStatus.DONE
        assert hold.take(trajs, st, [tid])[0] == []
    flushed = hold.flush(trajs, st)
    assert sorted(s.advantage for s in flushed) == sorted(s.advantage for s in grpo_samples(
        [trajs["s0-a-0"], trajs["s0-a-1"]]))
    assert not hold.held and hold.flush(trajs, st) == []


def test_groups_are_independent_and_trained_members_count_as_settled() -> None:
    trajs = {**_group("a", [0.0, 1.0]), **_group("b", [1.0, 0.0])}
    st = FakeState(trajs={t: FakeTrajState(TrajStatus.RUNNING) for t in trajs})
    hold = GroupHold()
    st.trajs["s0-a-0"].status = TrajStatus.TRAINED  # trained earlier (e.g. cut from the last step)
    st.trajs["s0-b-0"].status = TrajStatus.DONE
    st.trajs["s0-a-1"].status = TrajStatus.DONE
    samples, _ = hold.take(trajs, st, ["s0-b-0", "s0-a-1"])
    assert [s.group for s in samples] == ["s0/a"] and samples[0].advantage > 0
    assert hold.held == ("s0-b-0",)
    hold.clear()
    assert hold.held == ()
