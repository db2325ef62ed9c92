"""``elastic`` without a driver: the policy is driven by hand on a real ClusterState
(events in, commands out)."""

import random

import pytest

from rlsched.cluster.commands import Dispatch, OptimizerStep, Reassign, SyncWeights, TrainMicroBatch
from rlsched.cluster.errors import PolicyError
from rlsched.cluster.events import (
    RolesChanged,
    RunStarted,
    TrainStepFinished,
    TrajectoryFinished,
)
from rlsched.cluster.ids import Role, TrajStatus
from rlsched.cluster.state import ClusterState, EngineState
from rlsched.policies import make_policy
from rlsched.policies.oracle import Oracle


def _apply_dispatch(st: ClusterState, cmds) -> list[str]:
    sent = []
    for d in cmds:
        if not isinstance(d, Dispatch):
            continue
        for tid in d.trajectories:
            e = d.engine if d.engine is not None else st.least_loaded()
            st.mark_active(tid, TrajStatus.RUNNING, e)
            es = st.engines_[e]
            es.enqueue(tid)
            es.dequeue(admit=True)
            sent.append(tid)
    return sent


def _rolling_out(gpus: int, tp: int, n: int, spec: str = "elastic", steps: int = 1,
                 tasks: list[str] | None = None, policy=None) -> tuple[ClusterState, object]:
    """Every GPU rolls out and the policy places the batches its staleness allows (``n``
    trajectories each, ``T<step*n+i>``).

    Its trajectories finish, by hand, with one length (turns_done 0): a trace with no
    length spread, on which the default ``settle_auto`` would defer each micro-batch to a
    timer at the finish's instant (tested in ``test_elastic_settle.py``). The tests built
    on this pin the other rules on their own, so it is off unless the spec sets it."""
    tasks = tasks or ["task"] * n
    batches = [[(f"T{s * n + i}", tasks[i]) for i in range(n)] for s in range(steps)]
    if policy is None and spec.startswith("elastic") and "settle_auto" not in spec:
        spec += (":" if ":" not in spec else ",") + "settle_auto=false"
    pol = policy or make_policy(spec)
    st = ClusterState(gpus, tp, batches, max_staleness=pol.max_staleness)
    pol.reset(st, random.Random(0))
    cmd, *train = pol.on_event(RunStarted(), st)
    assert isinstance(cmd, Reassign) and cmd.role is Role.ROLLOUT
    for g in cmd.gpus:
        st.roles[g] = Role.ROLLOUT
    for e in sorted({st.engine_of(g) for g in cmd.gpus}):
        st.add_engine(EngineState(e, st.engine_gpus(e), 0, 1000))
    for t in train:  # with staleness a trainer starts too (train_share of the engines)
        assert isinstance(t, Reassign) and t.role is Role.TRAIN
        for g in t.gpus:
            st.roles[g] = Role.TRAIN
    sent = list(pol.on_event(RolesChanged(cmd.gpus, Role.ROLLOUT), st))
    for t in train:
        sent += pol.on_event(RolesChanged(t.gpus, Role.TRAIN), st)
    tids = _apply_dispatch(st, sent)
    assert len(tids) == n * min(steps, pol.max_staleness + 1)
    return st, pol


def _finish(st: ClusterState, tid: str, turns: int = 0) -> None:
    st.engines_[st.trajs[tid].engine].discard(tid)
    st.trajs[tid].turns_done = turns
    st.mark_finished(tid, TrajStatus.DONE)


def _to_train(st: ClusterState, pol, release: Reassign) -> list:
    for g in release.gpus:
        e = st.engine_of(g)
        if e in st.engines_:
            st.remove_engine(e)
        st.roles[g] = Role.TRAIN
    return pol.on_event(RolesChanged(release.gpus, Role.TRAIN), st)


def test_a_batch_is_spread_evenly_over_every_engine():
    st, _ = _rolling_out(16, 2, 32)
    assert sorted(load for _, load in st.engine_loads()) == [4] * 8


def test_an_emptied_engine_goes_to_training_only_when_there_is_work_to_train():
    st, pol = _rolling_out(8, 2, 8)  # 4 engines, 2 trajectories each
    on_0 = [t for t, ts in st.trajs.items() if ts.engine == 0]
    # engine 0 empties, but its trajectories are the only finished ones: there is work
    for t in on_0:
        _finish(st, t)
    cmds = pol.on_event(TrajectoryFinished(on_0[-1], TrajStatus.DONE, 0), st)
    (release,) = [c for c in cmds if isinstance(c, Reassign)]
    assert release.role is Role.TRAIN and release.gpus == st.engine_gpus(0)
    # the busy engines are kept: the tail is never packed onto fewer engines
    assert not set(release.gpus) & {g for e in (1, 2, 3) for g in st.engine_gpus(e)}


def test_no_engine_goes_to_training_before_anything_finished():
    st, pol = _rolling_out(8, 2, 8)
    on_0 = [t for t, ts in st.trajs.items() if ts.engine == 0]
    for t in on_0:  # engine 0 empties by an interrupt: nothing finished to train
        st.engines_[0].discard(t)
        st.mark_finished(t, TrajStatus.INTERRUPTED)
    cmds = pol.on_event(TrajectoryFinished(on_0[-1], TrajStatus.INTERRUPTED, 0), st)
    assert not [c for c in cmds if isinstance(c, Reassign) and c.role is Role.TRAIN]


def test_micro_batches_are_sized_to_the_trainer():
    st, pol = _rolling_out(16, 2, 32, "elastic:micro=1")
    on_0 = [t for t, ts in st.trajs.items() if ts.engine == 0]
    others = [t for t, ts in st.trajs.items() if ts.engine != 0][:16]
    for t in [*on_0, *others]:
        _finish(st, t)
    (release,) = [c for c in pol.on_event(TrajectoryFinished(on_0[-1], TrajStatus.DONE, 0), st)
                  if isinstance(c, Reassign)]
    ready = len(st.finished(0))
    (mb,) = [c for c in _to_train(st, pol, release) if isinstance(c, TrainMicroBatch)]
    assert ready > len(release.gpus) and len(mb.trajectories) == len(release.gpus)  # one per GPU


def test_on_policy_every_gpu_trains_once_the_rollout_is_over_then_all_return():
    st, pol = _rolling_out(8, 2, 8, steps=2)
    for t in list(st.batch(0)):
        _finish(st, t)
    cmds = pol.on_event(TrajectoryFinished("T7", TrajStatus.DONE, 3), st)
    (release,) = [c for c in cmds if isinstance(c, Reassign)]
    assert release.role is Role.TRAIN and set(release.gpus) == set(range(8))
    cmds = _to_train(st, pol, release)
    (mb,) = [c for c in cmds if isinstance(c, TrainMicroBatch)]
    for t in mb.trajectories:
        st.trajs[t].in_micro_batch = True
    st.mark_trained(mb.trajectories, 0)
    # the optimizer step follows the last micro-batch
    assert any(isinstance(c, OptimizerStep) for c in pol.on_event(TrajectoryFinished("T7", TrajStatus.DONE, 3), st))
    st.version = 1
    cmds = pol.on_event(TrainStepFinished(1), st)
    (back,) = [c for c in cmds if isinstance(c, Reassign)]
    assert back.role is Role.ROLLOUT and set(back.gpus) == set(range(8))  # batch 1 spreads again


def test_with_staleness_a_trainer_starts_beside_the_rollout():
    # staleness 1, 8 engines of 1 GPU: train_share=0.25 gives the trainer 2 engines from
    # the start (as the asynchronous split does); the two batches spread over the other 6
    st, _ = _rolling_out(8, 1, 8, "elastic:staleness=1,train_share=0.25", steps=3)
    assert st.gpus_in(Role.TRAIN) == (6, 7)
    assert sum(load for _, load in st.engine_loads()) == 16
    assert max(load for _, load in st.engine_loads()) <= 3  # cap: 16 over 6 engines


def test_a_new_batch_takes_back_the_engines_it_needs_and_the_trainer_keeps_the_rest():
    # batch 0 trained (version 1), batch 1 has finished work waiting: batch 2 (8
    # trajectories, at most 3 per engine) is released and takes back 3 engines from the
    # trainer (which holds all 8 GPUs); the trainer keeps the others for batch 1. (4 steps:
    # batch 2 is not the run's last, whose cap counts only the work in flight --
    # tests/test_policy_elastic_split.py)
    st, pol = _rolling_out(8, 1, 8, "elastic:staleness=1,train_share=0.25", steps=4)
    for t in [*st.batch(0), "T8", "T9", "T10", "T11"]:
        _finish(st, t)
    for e in range(6):
        for t in list(st.engines_[e].running):
            st.engines_[e].discard(t)
        st.remove_engine(e)
        st.roles[e] = Role.TRAIN
    pol._switches.pending = 0
    pol._train_step, pol._in_micro, pol._opt_sent = 0, 8, True
    for tid in st.batch(0):
        st.trajs[tid].in_micro_batch = True
    st.mark_trained(st.batch(0), 0)
    st.version = 1
    cmds = pol.on_event(TrainStepFinished(1), st)
    back = [c for c in cmds if isinstance(c, Reassign)]
    assert len(back) == 1 and back[0].role is Role.ROLLOUT and len(back[0].gpus) == 3


def test_with_train_share_0_every_gpu_rolls_out_first():
    # train_share=0: no trainer is reserved before anything has finished; the two batches
    # the staleness allows spread over all 8 engines
    st, _ = _rolling_out(8, 1, 8, "elastic:staleness=1,train_share=0", steps=3)
    assert st.gpus_in(Role.TRAIN) == ()
    assert sorted(load for _, load in st.engine_loads()) == [2] * 8


def _backlog_then_release(spec: str) -> int:
    """Batch 0 trained; of batch 1, T8-T11 (1000 tokens each) finished and not yet trained,
    T12-T14 finished empty, T15 still running on the one engine left in rollout; the
    trainer holds the other 7 GPUs and the policy has measured 0.01 GPU-s per trained
    token and a 20 s rollout. Batch 2 is released; returns how many GPUs it takes back
    from the trainer (it wants 4 engines: 8 trajectories, 2 per engine)."""
    st, pol = _rolling_out(8, 1, 8, spec, steps=3)
    for t in [*st.batch(0), "T8", "T9", "T10", "T11", "T12", "T13", "T14"]:
        st.trajs[t].tokens = 1000 if t in ("T8", "T9", "T10", "T11") else 0
        _finish(st, t)
    for e in list(st.engines_):
        if not st.engines_[e].running:
            st.remove_engine(e)
            st.roles[e] = Role.TRAIN
    assert len(st.engines()) == 1 and len(st.gpus_in(Role.TRAIN)) == 7
    pol._switches.pending = 0
    pol._train_step, pol._in_micro, pol._opt_sent = 0, 8, True
    pol._meter.train_gpu_s_per_token, pol._meter.rollout_s = 0.01, 20.0
    for tid in st.batch(0):
        st.trajs[tid].in_micro_batch = True
    st.mark_trained(st.batch(0), 0)
    st.version = 1
    back = [c for c in pol.on_event(TrainStepFinished(1), st) if isinstance(c, Reassign)]
    assert all(c.role is Role.ROLLOUT for c in back)
    return sum(len(c.gpus) for c in back)


def test_the_trainer_keeps_enough_to_train_its_backlog_within_train_within_of_a_rollout():
    # backlog 4000 tokens x 0.01 GPU-s = 40 GPU-s. train_within=1 (the old rule): train it
    # within the 20 s a rollout took -> keep 2 GPUs, give back the 4 engines batch 2 wants
    # (the default); 0.4: within 8 s -> keep 5 of 7, give back 2 (the trainer's step end
    # releases the batch after next: its backlog is on that chain); 0.1: keep all 7
    # (train_share=0: the scene below has no reserved trainer)
    assert _backlog_then_release("elastic:staleness=1,train_share=0") == 4
    assert _backlog_then_release("elastic:staleness=1,train_share=0,train_within=0.4") == 2
    assert _backlog_then_release("elastic:staleness=1,train_share=0,train_within=0.1") == 0


def _flat_tail(spec: str) -> list:
    """Staleness 1, 2 engines of 1 GPU, no trainer yet: batches 0 and 1 (8 each) hold 8
    trajectories per engine and a KV cache 90% full (past kv_limit: consolidation would keep
    both engines). 9 finish, 4-5 from each engine, so neither empties: the commands after
    the 9th."""
    st, pol = _rolling_out(2, 1, 8, spec, steps=3)
    assert st.gpus_in(Role.TRAIN) == ()
    for e in st.engines_:
        st.engines_[e].set_kv(900)
    on = {e: [t for t, ts in st.trajs.items() if ts.engine == e] for e in (0, 1)}
    done = on[0][:5] + on[1][:4]
    for t in done:
        _finish(st, t)
    return pol.on_event(TrajectoryFinished(done[-1], TrajStatus.DONE, 0), st)


def test_an_empty_trainer_with_as_much_finished_as_live_gets_an_engine_even_packing_the_tail():
    # hedge (do no harm): no engine empties -- a flat tail -- so without it the finished
    # work waits for the batch's end while a fixed split would be training it
    (release,) = [c for c in _flat_tail("elastic:staleness=1,train_share=0") if isinstance(c, Reassign)]
    assert release.role is Role.TRAIN and len(release.gpus) == 1
    assert not [c for c in _flat_tail("elastic:staleness=1,train_share=0,hedge=false") if isinstance(c, Reassign)]


def test_oracle_needs_the_true_lengths():
    with pytest.raises(PolicyError, match="true number of turns"):
        Oracle()


def test_oracle_places_the_truly_longest_first():
    lengths = {f"T{i}": i for i in range(8)}  # T7 the longest
    oracle = Oracle.from_lengths(lengths, pack=0.25)  # cap 1 per engine: 2 engines, 2 placed
    st, _ = _rolling_out(4, 2, 2, policy=oracle)
    placed = {t for t, ts in st.trajs.items() if ts.status is TrajStatus.RUNNING}
    assert placed == {"T0", "T1"}  # (n=2: both fit; the order matters below)
    ordered = Oracle.from_lengths({"A": 3, "B": 50, "C": 7, "D": 1}, pack=0.5)
    batches = [[("A", "a"), ("B", "b"), ("C", "c"), ("D", "d")]]
    st = ClusterState(4, 2, batches, max_staleness=0)
    ordered.reset(st, random.Random(0))
    (cmd,) = ordered.on_event(RunStarted(), st)
    for g in cmd.gpus:
        st.roles[g] = Role.ROLLOUT
    for e in range(2):
        st.add_engine(EngineState(e, st.engine_gpus(e), 0, 1000))
    sent = _apply_dispatch(st, ordered.on_event(RolesChanged(cmd.gpus, Role.ROLLOUT), st))
    assert sent[:2] == ["B", "C"] or set(sent[:2]) == {"B", "C"}  # cap 1 x 2 engines: the two longest
    assert len(sent) == 2


def test_trainer_gpus_already_sent_back_are_not_sent_twice():
    """GPUs sent from the trainer to rollout stay in TRAIN until their micro-batch ends; a
    second Reassign of the same GPUs replaced the first in the driver, whose group then
    never reported, and the policy waited for it forever (a stall at step 11 of 12 on the
    growing preset, 64 GPUs, pack=0.5)."""
    from rlsched.cluster.config import RunConfig
    from rlsched.sim.cost import CostModel
    from rlsched.sim.run import simulate
    from rlsched.sim.workload import Workload
    from rlsched.traces import draw_batches, generate_trace

    df = generate_trace("longtail-growing", seed=0)
    out = simulate(Workload.from_frame(df), draw_batches(df, 12, 16), make_policy("elastic:staleness=1,pack=0.5"),
                   RunConfig(gpus=64, tp=4, steps=12), CostModel())
    assert out.result.complete


def test_an_engine_that_opens_with_old_weights_is_synced():
    # a driver may load the weights when a switch starts; if an optimizer step ends during
    # the switch, the engine opens one version behind and must be synced to serve new work
    st, pol = _rolling_out(8, 1, 8, "elastic:staleness=1,train_share=0.25", steps=3)
    trainer = st.gpus_in(Role.TRAIN)
    g = trainer[-1]
    st.roles[g] = Role.ROLLOUT
    st.add_engine(EngineState(g, (g,), 0, 1000))  # opens holding version 0
    st.version = 1
    pol._switches.pending += 1
    cmds = pol.on_event(RolesChanged((g,), Role.ROLLOUT), st)
    assert SyncWeights((g,)) in cmds
    st.engines_[g].version = 1  # an engine already current is not synced again
    pol._switches.pending += 1
    assert not [c for c in pol.on_event(RolesChanged((g,), Role.ROLLOUT), st) if isinstance(c, SyncWeights)]
