"""Elastic's placement while engines come back to rollout and its held split, without a
driver (events in, commands out, on a real ClusterState): the engines up take only their
share of the work in flight over the engines up and coming, and a held split
whose trainer is empty still grows to its side instead of stalling; a trainer emptied back
to rollout after failures is never left below its memory floor by the first of two
Reassigns."""

import random

from test_policy_elastic import _finish, _rolling_out

from rlsched.cluster.commands import Dispatch, Reassign
from rlsched.cluster.events import TrainStepFinished, TrajectoryFinished
from rlsched.cluster.ids import Role, TrajStatus
from rlsched.cluster.legality import check as legality_check
from rlsched.cluster.state import ClusterState
from rlsched.policies import make_policy
from rlsched.policies.elastic.split import at_trainer_floor, held_trainer_gpus, share_while_coming


def test_the_share_while_coming_spreads_what_is_in_flight_over_the_engines_up_and_coming():
    assert share_while_coming(cap=48, in_flight=48, up=1, coming=1, pack=1.0) == 24
    assert share_while_coming(cap=16, in_flight=48, up=1, coming=1, pack=1.0) == 16  # never above the cap
    assert share_while_coming(cap=48, in_flight=48, up=1, coming=0, pack=1.0) == 48  # (none coming)
    assert share_while_coming(cap=64, in_flight=10, up=2, coming=3, pack=2.0) == 4
    assert share_while_coming(cap=8, in_flight=0, up=1, coming=1, pack=1.0) == 1


def test_a_held_trainer_side_is_half_the_engines_rounded_up():
    # 3 engines of 2 GPUs: the trainer holds two of them (4 GPUs), one rolls out; rounded
    # down (session 12) it held one, and the uniform case seed 861126 ran 6.9% behind
    assert held_trainer_gpus(step_gpu_s=10.0, switch_s=8.0, gpus=6, tp=2, floor=1) == 4
    assert held_trainer_gpus(step_gpu_s=10.0, switch_s=8.0, gpus=8, tp=1, floor=1) == 4
    assert held_trainer_gpus(step_gpu_s=10.0, switch_s=8.0, gpus=2, tp=1, floor=1) == 1
    assert held_trainer_gpus(step_gpu_s=10.0, switch_s=8.0, gpus=28, tp=4, floor=1) == 16
    assert held_trainer_gpus(step_gpu_s=10.0, switch_s=8.0, gpus=4, tp=4, floor=1) == 0  # one engine


def test_a_held_trainer_side_is_at_least_its_floor_and_leaves_an_engine_to_roll_out():
    assert held_trainer_gpus(step_gpu_s=10.0, switch_s=8.0, gpus=8, tp=2, floor=6) == 6
    assert held_trainer_gpus(step_gpu_s=10.0, switch_s=8.0, gpus=8, tp=2, floor=5) == 6  # (whole engines)
    assert held_trainer_gpus(step_gpu_s=10.0, switch_s=8.0, gpus=8, tp=2, floor=7) == 0  # no room


def test_a_split_holds_when_a_move_from_it_to_every_gpu_saves_no_more_than_two_switches():
    # 100 GPU-s on 8 GPUs: 25 s on the held 4, 12.5 s on all 8 -- at most 12.5 s saved,
    # under two 8 s switches: hold (the whole 25 s, the test until session 12, is over 16)
    assert held_trainer_gpus(step_gpu_s=100.0, switch_s=8.0, gpus=8, tp=1, floor=1) == 4
    # 200 GPU-s: 50 s against 25 s saves 25 s, more than two switches: GPUs move
    assert held_trainer_gpus(step_gpu_s=200.0, switch_s=8.0, gpus=8, tp=1, floor=1) == 0
    # exactly two switches saved: nothing to gain from moving, hold
    assert held_trainer_gpus(step_gpu_s=128.0, switch_s=8.0, gpus=8, tp=1, floor=1) == 4


def _last_batch_released(coming: int) -> tuple[list, object, object]:
    """Staleness 1, 3 steps of 12 trajectories, 8 engines of 1 GPU (the trainer on 2,
    ``train_share`` 0.25; ``hold=false``). Batches 0 and 1 finished and batch 0 was trained;
    engine 0 is up and ``coming`` more are on their way back to rollout (the others are
    gone): the commands at step 0's optimizer step's end, which releases batch 2, the last."""
    st, pol = _rolling_out(8, 1, 12, "elastic:staleness=1,hold=false", steps=3)
    for t in st.batch(0) + st.batch(1):
        _finish(st, t)
    for e in range(1, 6):
        st.remove_engine(e)
        st.roles[e] = Role.SWITCHING if e <= coming else Role.TRAIN
    pol._switches.to_rollout.update(range(1, coming + 1))
    pol._train_step, pol._in_micro, pol._opt_sent = 0, 12, True
    for tid in st.batch(0):
        st.trajs[tid].in_micro_batch = True
    st.mark_trained(st.batch(0), 0)
    st.version = 1
    for es in st.engines_.values():
        es.version = 1
    return list(pol.on_event(TrainStepFinished(1), st)), st, pol


def test_the_engine_up_takes_only_its_share_of_the_last_batch_while_others_come_back():
    # the steady-state cap (two batches over the 6 rollout engines) is 4; with five engines
    # coming, engine 0 takes its share of the 12 over six engines, 2, and the rest waits for
    # them (5 held for the coming engines as before, 5 more above the share)
    cmds, _, pol = _last_batch_released(coming=5)
    assert pol._cap == 4
    assert [(c.engine, len(c.trajectories)) for c in cmds if isinstance(c, Dispatch)] == [(0, 2)]
    assert len(pol._queue) == 10
    # one engine coming: the share over the two engines is 6, above the steady-state cap,
    # so engine 0 takes 4 as before (the share counts only engines actually coming)
    cmds, _, pol = _last_batch_released(coming=1)
    assert [(c.engine, len(c.trajectories)) for c in cmds if isinstance(c, Dispatch)] == [(0, 4)]


def test_a_held_split_grows_an_empty_trainer():
    # Staleness 1, no trainer (train_share=0), 8 engines of 1 GPU rolling out batches 0-1.
    # A hold of 4 GPUs set at an optimizer step finds the trainer empty (a batch released
    # while no engine rolled out took every GPU back): the next decision sends the four
    # least loaded engines to it; before, it waited for consolidation, which a held split
    # skips, and the run stalled
    st, pol = _rolling_out(8, 1, 8, "elastic:staleness=1,train_share=0", steps=3)
    assert not st.gpus_in(Role.TRAIN)
    pol._hold = 4
    _finish(st, "T0")
    cmds = pol.on_event(TrajectoryFinished("T0", TrajStatus.DONE, 0), st)
    (grow,) = [c for c in cmds if isinstance(c, Reassign)]
    assert grow.role is Role.TRAIN and len(grow.gpus) == 4
    assert st.engine_of(0) in {st.engine_of(g) for g in grow.gpus}  # (T0's engine: the least loaded)
    assert not [c for c in cmds if isinstance(c, Dispatch)]  # (nothing queued to place)


def _stranded_trainer(floor: int, failed: tuple[int, ...] = ()):
    """4 engines of 2 GPUs; the trainer holds 2, 3, 4 and 5, and 5 already leaves it (sent
    away while a micro-batch runs: still TRAIN, its engine not whole), at its memory floor
    ``floor``; the ``failed`` GPUs are down; no engine rolls out and a trajectory waits: the
    trainer is emptied back to rollout (``_reclaim``). The commands, each checked as the
    driver would (the state does not change between them: only GPUs already leaving, or
    moved by the command itself, count as gone)."""
    st = ClusterState(8, 2, [[("A", "t")]], max_staleness=0)
    st.roles.assign((2, 3, 4, 5), Role.TRAIN)
    st.set_trainer_floor(floor, 2, why="hand floor")
    st.leave_train_later(5, 0, Role.IDLE)
    for g in failed:
        st.mark_failed(g)
    pol = make_policy("elastic")
    pol.reset(st, random.Random(0))
    pol._switches.moving.add(5)
    pol._queue.add(0, ("A",))
    cmds = pol._reclaim(st, st.trainer())
    legality_check(st, cmds[0])  # (the first is checked before the second is applied)
    return [(c.gpus, c.role) for c in cmds]


def test_emptying_a_trainer_never_leaves_it_below_its_floor_between_two_reassigns():
    # Engine (2, 3) rolls out and 4 goes idle (its partner 5 is leaving). Rollout first
    # would leave 4 alone, below a floor of 2, though it could have gone along (refused:
    # the fingerprint's fault run stopped on it); idle first leaves (2, 3), at the floor
    assert _stranded_trainer(floor=2) == [((4,), Role.IDLE), ((2, 3), Role.ROLLOUT)]
    # a floor of 4: either order leaves the trainer below it -- every GPU it still holds
    # goes idle in one Reassign, and whole engines roll out from there
    assert _stranded_trainer(floor=4) == [((2, 3, 4), Role.IDLE)]
    # 5 failed instead (4 could not have gone along): rollout first, as always
    assert _stranded_trainer(floor=2, failed=(5,)) == [((2, 3), Role.ROLLOUT), ((4,), Role.IDLE)]


def test_the_trainer_is_lifted_to_its_floor_in_whole_engines_or_not_formed():
    # 4 GPUs asked, floor 6, engines of 4: 8 GPUs; room for at most 8: formed
    assert at_trainer_floor(4, 6, 4, 8) == 8
    # the same with room for 4 only: no trainer (0), not one below its floor
    assert at_trainer_floor(4, 6, 4, 4) == 0
    # at or above the floor: as asked
    assert at_trainer_floor(8, 6, 4, 12) == 8
