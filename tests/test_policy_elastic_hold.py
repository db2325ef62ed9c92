"""``elastic:hold`` and ``elastic:join`` without a driver (events in, commands out, on a
real ClusterState): once a step's measured training is too short for any move between the
roles to repay its switches, elastic holds a fixed half split; a trajectory ready to train
waits for GPUs on their way to the trainer when it would finish sooner on them."""

from test_policy_elastic import _finish, _rolling_out, _to_train

from rlsched.cluster.commands import Dispatch, Reassign, TrainMicroBatch
from rlsched.cluster.events import TrainStepFinished, TrajectoryFinished
from rlsched.cluster.ids import Role, TrajStatus
from rlsched.policies.meter import Meter


def test_the_meter_knows_a_steps_training_work_only_once_both_rate_and_step_were_seen():
    m = Meter()
    assert m.step_train_gpu_s() is None
    m.micro_batch_sent(gpus=2, tokens=4000, now=0.0)
    m.step_trained()
    assert m.step_train_gpu_s() is None  # no micro-batch timed yet
    m.micro_batch_sent(gpus=2, tokens=1000, now=10.0)
    m.micro_batch_done(now=11.0)  # 2 GPU-s for 1000 tokens
    assert m.step_train_gpu_s() == 4000 * 0.002  # (the last step's tokens, at the new rate)
    m.micro_batch_sent(gpus=2, tokens=3000, now=11.0)
    m.step_trained()
    assert m.step_train_gpu_s() == (1000 + 3000) * 0.002
    m.step_trained()  # (an empty step measures nothing: the last one stands)
    assert m.step_train_gpu_s() == 4000 * 0.002


def _step_one_trained(spec: str, step_tokens: int) -> tuple[list, object, object]:
    """Staleness 1, 8 engines of 1 GPU, the trainer on 2 of them (train_share 0.25), batches
    0 and 1 rolling out on the other 6. Batch 0 finished and was trained (``step_tokens``
    tokens, measured at 0.001 GPU-s per token; a role switch measured 8 s): the commands
    at its optimizer step's end, which releases batch 2."""
    st, pol = _rolling_out(8, 1, 8, spec, steps=3)
    assert st.gpus_in(Role.TRAIN) == (6, 7)
    for t in st.batch(0):
        _finish(st, t)
    pol._train_step, pol._in_micro, pol._opt_sent = 0, 8, True
    pol._meter.micro_batch_sent(gpus=2, tokens=step_tokens, now=0.0)  # (step 0's training)
    pol._meter.train_gpu_s_per_token, pol._meter.switch_s = 0.001, 8.0
    for tid in st.batch(0):
        st.trajs[tid].in_micro_batch = True
    st.mark_trained(st.batch(0), 0)
    st.version = 1
    for es in st.engines_.values():  # (weights loaded with the step: batch 2 may be placed)
        es.version = 1
    return list(pol.on_event(TrainStepFinished(1), st)), st, pol


def test_a_step_too_light_to_repay_a_switch_holds_half_the_gpus_in_the_trainer():
    # 4000 tokens x 0.001 = 4 GPU-s: 1 s on half the GPUs (4), under two 8 s switches. The
    # trainer (2 GPUs) grows to 4 with the two least loaded engines (of equal loads the
    # highest ids), and batch 2 is placed on the four that stay, none on those leaving
    cmds, st, pol = _step_one_trained("elastic:staleness=1", 4000)
    assert pol._hold == 4
    (grow,) = [c for c in cmds if isinstance(c, Reassign)]
    assert grow.role is Role.TRAIN and len(grow.gpus) == 2
    leaving = {st.engine_of(g) for g in grow.gpus}
    placed = [c for c in cmds if isinstance(c, Dispatch)]
    assert sum(len(c.trajectories) for c in placed) == 8
    assert leaving.isdisjoint(c.engine for c in placed)
    loads = dict(st.engine_loads())  # (batch 1's, before batch 2 lands)
    assert all(loads[c.engine] + len(c.trajectories) <= 4 for c in placed)  # cap: 16 over 4


def test_a_step_heavy_enough_to_repay_a_switch_holds_nothing():
    # 200000 tokens: 200 GPU-s, 50 s on 4 GPUs and 25 s on all 8: a move saves more than two
    # switches, so GPUs move as before (the trainer's GPUs stay, nothing goes to training
    # while batch 2 is placed)
    cmds, _, pol = _step_one_trained("elastic:staleness=1", 200_000)
    assert pol._hold == 0
    assert not [c for c in cmds if isinstance(c, Reassign) and c.role is Role.TRAIN]


def test_a_step_whose_move_saves_less_than_two_switches_holds_though_it_is_longer():
    # 100000 tokens: 25 s on the held 4 GPUs, longer than two 8 s switches (the test until
    # session 12 moved GPUs here), but on all 8 it would still take 12.5 s: a move saves at
    # most 12.5 s, less than its switches, so the split holds
    _, _, pol = _step_one_trained("elastic:staleness=1", 100_000)
    assert pol._hold == 4


def test_hold_false_and_staleness_0_never_hold():
    cmds, _, pol = _step_one_trained("elastic:staleness=1,hold=false", 4000)
    assert pol._hold == 0
    assert not [c for c in cmds if isinstance(c, Reassign) and c.role is Role.TRAIN]
    st, on_policy = _rolling_out(8, 1, 8, "elastic", steps=2)  # k=0: all train at a step's end
    on_policy._meter.micro_batch_sent(gpus=8, tokens=4000, now=0.0)
    on_policy._meter.step_trained()
    on_policy._meter.train_gpu_s_per_token, on_policy._meter.switch_s = 0.001, 8.0
    assert on_policy._hold_gpus(st) == 0


def _trainer_of_seven(spec: str, rollout_s: float) -> tuple[list, object]:
    """Staleness 1, 4 steps, 8 engines of 1 GPU: batches 0 and 1 finished, the trainer holds
    7 GPUs and engine 0 alone rolls out; step 0 (4000 tokens at 0.001 GPU-s per token; a
    switch measured 8 s; the last batch's rollout ``rollout_s``) was trained: the commands at
    its optimizer step's end, which releases batch 2 (not the run's last, whose cap counts
    only the work in flight)."""
    st, pol = _rolling_out(8, 1, 8, spec, steps=4)
    for t in [*st.batch(0), *st.batch(1)]:
        _finish(st, t)
    for e in [e for e in st.engines_ if e != 0]:
        st.remove_engine(e)
        st.roles[e] = Role.TRAIN
    pol._switches.pending = 0
    pol._train_step, pol._in_micro, pol._opt_sent = 0, 8, True
    pol._meter.micro_batch_sent(gpus=2, tokens=4000, now=0.0)  # (step 0's training)
    pol._meter.train_gpu_s_per_token, pol._meter.switch_s, pol._meter.rollout_s = 0.001, 8.0, rollout_s
    for tid in st.batch(0):
        st.trajs[tid].in_micro_batch = True
    st.mark_trained(st.batch(0), 0)
    st.version = 1
    st.engines_[0].version = 1
    return list(pol.on_event(TrainStepFinished(1), st)), pol


def test_a_held_trainer_gives_back_what_is_above_its_side():
    # Held at 4 GPUs, the trainer has 7 when batch 2 is released with one engine up (engine
    # 0 takes 4 of it, the cap over the held rollout side): the trainer gives back the 3
    # above its side, not only the one engine the 4 still queued ask for
    cmds, pol = _trainer_of_seven("elastic:staleness=1", rollout_s=50.0)
    assert pol._hold == 4
    assert sum(len(c.trajectories) for c in cmds if isinstance(c, Dispatch)) == 4
    back = [c for c in cmds if isinstance(c, Reassign)]
    assert [c.role for c in back] == [Role.ROLLOUT] and len(back[0].gpus) == 3


def test_a_held_trainer_gives_back_what_is_above_its_side_even_after_a_short_rollout():
    # The last batch rolled out in 10 s, less than two 8 s switches: without a held split
    # the trainer keeps its GPUs and the queue waits for the engine up (a switch back would
    # not pay for that batch); a held split's trainer still gives back the 3 above its
    # side, which every later batch rolls out on (until session 12 it kept them: seed 439460
    # of the uniform preset rolled out two batches on one engine beside a trainer of three,
    # 7.5% behind the best async; now even with it)
    cmds, pol = _trainer_of_seven("elastic:staleness=1", rollout_s=10.0)
    assert pol._hold == 4
    back = [c for c in cmds if isinstance(c, Reassign)]
    assert [c.role for c in back] == [Role.ROLLOUT] and len(back[0].gpus) == 3
    cmds, pol = _trainer_of_seven("elastic:staleness=1,hold=false", rollout_s=10.0)
    assert not [c for c in cmds if isinstance(c, Reassign)]


def _ready_while_gpus_join(spec: str, tokens: int) -> list:
    """Staleness 1, the trainer on GPUs 6-7 (train_share 0.25) and GPUs 0-1 on their way
    to it (sent at t=100, a switch measured 8 s, training 0.001 GPU-s per token); at t=101
    T0 finishes with ``tokens`` tokens: the commands."""
    st, pol = _rolling_out(8, 1, 8, spec, steps=3)
    pol._meter.train_gpu_s_per_token, pol._meter.switch_s = 0.001, 8.0
    pol._switches.to_train[(0, 1)] = 100.0
    st.roles[0] = st.roles[1] = Role.SWITCHING
    st.advance(101.0)
    st.trajs["T0"].tokens = tokens
    _finish(st, "T0")
    return list(pol.on_event(TrajectoryFinished("T0", TrajStatus.DONE, 0), st))


def test_a_long_trajectory_waits_for_gpus_on_their_way_to_the_trainer():
    # 100k tokens: 50 s on the 2 GPUs now; at t=108 on 4: 7 + 25 s -- it waits (join)
    assert not [c for c in _ready_while_gpus_join("elastic:staleness=1", 100_000)
                if isinstance(c, TrainMicroBatch)]
    # 1000 tokens: 0.5 s now, before the GPUs arrive: it starts at once
    (mb,) = [c for c in _ready_while_gpus_join("elastic:staleness=1", 1000) if isinstance(c, TrainMicroBatch)]
    assert mb.trajectories == ("T0",)
    # join=false: it starts at once whatever its length
    (mb,) = [c for c in _ready_while_gpus_join("elastic:staleness=1,join=false", 100_000)
             if isinstance(c, TrainMicroBatch)]
    assert mb.trajectories == ("T0",)


def test_a_micro_batch_waits_for_any_measured_saving_not_only_one_of_half_a_switch():
    # 36k tokens: 18 s on the 2 GPUs now (ends t=119); at t=108 on 4: 9 s (ends 117). The
    # wait saves 2 s, a quarter of the 8 s switch: it waits (until 2026-12 only a saving of
    # more than half a switch made it wait; the trainer runs one job at a time, so starting
    # on 2 GPUs would also hold back the 2 arriving at t=108 until t=119)
    assert not [c for c in _ready_while_gpus_join("elastic:staleness=1", 36_000)
                if isinstance(c, TrainMicroBatch)]
    # 20k tokens: 10 s now (ends 111) against 108 + 5 s: no saving, it starts at once
    (mb,) = [c for c in _ready_while_gpus_join("elastic:staleness=1", 20_000) if isinstance(c, TrainMicroBatch)]
    assert mb.trajectories == ("T0",)


def _last_on_its_engine_finishes(spec: str, tokens: int) -> list:
    """On-policy, 4 engines of 1 GPU with one trajectory each. T0 finished and its engine
    joined the trainer, which trained it (0.001 GPU-s per token; a switch measured 8 s).
    At t=10 T1 finishes with ``tokens`` tokens, emptying its engine: the commands (the
    engine goes to the trainer in the same decision)."""
    st, pol = _rolling_out(4, 1, 4, spec)
    _finish(st, "T0")
    (release,) = [c for c in pol.on_event(TrajectoryFinished("T0", TrajStatus.DONE, 0), st)
                  if isinstance(c, Reassign)]
    (mb,) = [c for c in _to_train(st, pol, release) if isinstance(c, TrainMicroBatch)]
    assert mb.trajectories == ("T0",)
    st.trajs["T0"].in_micro_batch = True
    pol._meter.train_gpu_s_per_token, pol._meter.switch_s = 0.001, 8.0
    st.advance(10.0)
    st.trajs["T1"].tokens = tokens
    _finish(st, "T1")
    return list(pol.on_event(TrajectoryFinished("T1", TrajStatus.DONE, 0), st))


def test_a_micro_batch_waits_for_an_engine_released_to_the_trainer_in_the_same_decision():
    # 100k tokens: 100 s on the trainer's 1 GPU now, 8 + 50 s on 2 once T1's engine has
    # switched: the micro-batch is withheld, the engine still goes
    cmds = _last_on_its_engine_finishes("elastic", 100_000)
    assert [c.role for c in cmds if isinstance(c, Reassign)] == [Role.TRAIN]
    assert not [c for c in cmds if isinstance(c, TrainMicroBatch)]
    # 1000 tokens (1 s now) or join=false: it starts at once beside the release
    for spec, tokens in (("elastic", 1000), ("elastic:join=false", 100_000)):
        cmds = _last_on_its_engine_finishes(spec, tokens)
        assert [c.role for c in cmds if isinstance(c, Reassign)] == [Role.TRAIN]
        (mb,) = [c for c in cmds if isinstance(c, TrainMicroBatch)]
        assert mb.trajectories == ("T1",)


def test_a_late_report_of_a_switch_does_not_end_the_next_one():
    # GPUs 0-3 reach rollout at t=8 (sent at 0); their engine, idle, goes on to the trainer
    # at t=8 before the driver's RolesChanged(rollout) arrives: that report ends the first
    # switch only (8 s, not 0 s for the second), and the trainer still expects the GPUs
    m = Meter()
    m.switch_sent((0, 1, 2, 3), 0.0, Role.ROLLOUT)
    m.switch_sent((0, 1, 2, 3), 8.0, Role.TRAIN)
    m.switch_done((0, 1, 2, 3), 8.0, Role.ROLLOUT)
    assert m.switch_s == 8.0
    m.switch_done((0, 1, 2, 3), 16.5, Role.TRAIN)
    assert m.switch_s == 8.5
    st, pol = _rolling_out(8, 1, 8, "elastic:staleness=1", steps=3)
    pol._send(st, (0,), Role.ROLLOUT)
    pol._send(st, (0,), Role.TRAIN)
    st.roles[0] = Role.SWITCHING
    pol._switches.arrive((0,), Role.ROLLOUT, st)
    assert (0,) in pol._switches.to_train and 0 in pol._switches.moving
    st.roles[0] = Role.TRAIN
    pol._switches.arrive((0,), Role.TRAIN, st)
    assert (0,) not in pol._switches.to_train and 0 not in pol._switches.moving
