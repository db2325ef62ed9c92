"""Elastic's spread of a batch near the run's end and its held split, without a driver
(events in, commands out, on a real ClusterState): the last batch's per-engine cap counts
the work that is actually in flight (not batches that will never come), and a held split
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
from rlsched.policies.split import work_in_flight


def test_work_in_flight_counts_only_batches_that_exist():
    assert work_in_flight(48, ahead=1, later=1, older=0) == 96  # steady state: k+1 batches
    assert work_in_flight(48, ahead=1, later=1, older=40) == 96  # (as before: unchanged)
    assert work_in_flight(48, ahead=1, later=0, older=0) == 48  # the last batch, alone
    assert work_in_flight(48, ahead=1, later=0, older=30) == 78  # ... beside the older tail
    assert work_in_flight(8, ahead=2, later=1, older=3) == 19
    assert work_in_flight(8, ahead=0, later=0, older=0) == 8  # on-policy: one batch


def _last_batch_released(older_done: bool, coming: bool = False) -> tuple[list, object, object]:
    """Staleness 1, 3 steps of 12 trajectories, 8 engines of 1 GPU (the trainer on 2,
    ``train_share`` 0.25; ``hold=false``). Batch 0 was trained; batch 1 finished too
    (``older_done``) or still rolls out; with ``coming`` engines 1-5 are on their way back to
    rollout and only engine 0 is up: the commands at step 0's optimizer step's end, which
    releases batch 2, the last."""
    st, pol = _rolling_out(8, 1, 12, "elastic:staleness=1,hold=false", steps=3)
    for t in st.batch(0) + (st.batch(1) if older_done else ()):
        _finish(st, t)
    if coming:
        for e in range(1, 6):
            st.remove_engine(e)
            st.roles[e] = Role.SWITCHING
        pol._to_rollout.update(range(1, 6))
    pol._train_step, pol._in_micro, pol._opt_sent = 0, 12, True
    for tid in st.batch(0):
        st.trajs[tid].in_micro_batch = True
    st.mark_trained(st.batch(0), 0)
    st.version = 1
    for es in st.engines_.values():
        es.version = 1
    return list(pol.on_event(TrainStepFinished(1), st)), st, pol


def test_the_last_batch_alone_is_spread_for_itself_not_for_two_batches():
    # 12 trajectories over the 6 rollout engines: an even spread is 2 an engine (for two
    # batches in flight it would be 4, the placement cap of every batch before the last)
    _, _, pol = _last_batch_released(older_done=True)
    assert (pol._spread_cap, pol._cap) == (2, 4)
    # batch 1 still rolling out (12 live): its trajectories count, the spread stays 4
    _, _, pol = _last_batch_released(older_done=False)
    assert pol._spread_cap == 4
    # engine 0 up, five on their way: it takes 2 (not 4) and the rest waits for them (5 of
    # them held for the coming engines as before, and 5 more, above the spread)
    cmds, _, pol = _last_batch_released(older_done=True, coming=True)
    assert [(c.engine, len(c.trajectories)) for c in cmds if isinstance(c, Dispatch)] == [(0, 2)]
    assert len(pol._queue) == 10


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
    pol._moving.add(5)
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
