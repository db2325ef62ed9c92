"""``elastic``'s tail cutting (``cut``) and tail stealing (``steal``) without a driver: the
policy is driven by hand on a real ClusterState (events in, commands out)."""

import random

from rlsched.cluster.commands import (
    Dispatch,
    Interrupt,
    Move,
    OptimizerStep,
    Reassign,
    SetTimer,
    TrainMicroBatch,
)
from rlsched.cluster.events import (
    RolesChanged,
    RunStarted,
    TimerFired,
    TrainStepFinished,
    TrajectoryFinished,
)
from rlsched.cluster.ids import Role, TrajStatus
from rlsched.cluster.legality import check as legality_check
from rlsched.cluster.state import ClusterState, EngineState
from rlsched.policies import make_policy


def _start(spec: str, gpus: int, tp: int, n: int, steps: int) -> tuple[ClusterState, object, list[str]]:
    """Every GPU rolls out (no trainer at the start: these specs release no batch early);
    returns the trajectories the policy dispatched, applied to the state."""
    batches = [[(f"T{s * n + i}", "task") for i in range(n)] for s in range(steps)]
    pol = make_policy(spec)
    st = ClusterState(gpus, tp, batches, max_staleness=pol.max_staleness)
    pol.reset(st, random.Random(0))
    (cmd,) = pol.on_event(RunStarted(), st)
    assert isinstance(cmd, Reassign) and cmd.role is Role.ROLLOUT and len(cmd.gpus) == gpus
    for g in cmd.gpus:
        st.roles[g] = Role.ROLLOUT
    for e in sorted({st.engine_of(g) for g in cmd.gpus}):
        st.add_engine(EngineState(e, st.engine_gpus(e), 0, 1000))
    return st, pol, _dispatch(st, pol.on_event(RolesChanged(cmd.gpus, Role.ROLLOUT), st))


def _dispatch(st: ClusterState, cmds) -> list[str]:
    sent = []
    for d in cmds:
        if isinstance(d, Dispatch):
            for tid in d.trajectories:
                st.mark_active(tid, TrajStatus.RUNNING, d.engine)
                st.engines_[d.engine].enqueue(tid)
                st.engines_[d.engine].dequeue(admit=True)
                sent.append(tid)
    return sent


def _finish(st: ClusterState, tid: str) -> None:
    st.engines_[st.trajs[tid].engine].discard(tid)
    st.trajs[tid].turns_done = 3
    st.mark_finished(tid, TrajStatus.DONE)


def _train_all(st: ClusterState, cmds) -> list[str]:
    """The trainer runs the micro-batches at once (the test plays the driver)."""
    done = []
    for c in cmds:
        if isinstance(c, TrainMicroBatch):
            st.mark_trained(c.trajectories, st.version)
            done += c.trajectories
    return done


def _to_train(st: ClusterState, pol, cmds) -> list:
    out = []
    for r in [c for c in cmds if isinstance(c, Reassign) and c.role is Role.TRAIN]:
        for g in r.gpus:
            e = st.engine_of(g)
            if e in st.engines_:
                for t in list(st.engines_[e].running):
                    st.engines_[e].discard(t)
                st.remove_engine(e)
            st.roles[g] = Role.TRAIN
        out += pol.on_event(RolesChanged(r.gpus, Role.TRAIN), st)
    return out


def test_cutting_is_off_on_policy_and_declares_deferral_with_staleness():
    assert make_policy("elastic:cut=0.5").defers is False  # staleness 0: never cut
    assert make_policy("elastic").defers is False
    pol = make_policy("elastic:staleness=1,cut=0.5")
    assert pol.defers is True and pol.max_staleness == 1  # the bound is weaker, staleness is not


def test_with_cutting_a_batch_is_released_one_version_later():
    # staleness 1 with cut: batch 1 waits for weights 1 (so that a trajectory of it cut
    # and trained with step 2 is within staleness 1); without cut it goes at once
    _, _, sent = _start("elastic:staleness=1,cut=0.5", 8, 2, 8, 3)
    assert sorted(sent) == sorted(f"T{i}" for i in range(8))


def test_the_tail_is_cut_kept_running_and_trained_with_the_next_step():
    st, pol, sent = _start("elastic:staleness=1,cut=0.25", 8, 2, 8, 3)  # 4 engines x 2
    tail = ["T3", "T7"]  # both on engine 3
    for t in sent:
        if t not in tail:
            _finish(st, t)
            st.trajs[t].min_version = 0
    for t in tail:
        st.trajs[t].min_version = 0
    cmds = pol.on_event(TrajectoryFinished("T5", TrajStatus.DONE, 3), st)
    cmds = _to_train(st, pol, cmds)  # emptied engines go to the trainer, which trains
    trained = _train_all(st, cmds)
    assert sorted(trained) == ["T0", "T1", "T2", "T4", "T5", "T6"]
    # the trainer waits for 2 of 8 (<= 25%): they are cut -- not stopped -- and step 0 ends
    cmds = pol.on_event(TrajectoryFinished("T5", TrajStatus.DONE, 3), st)
    assert any(isinstance(c, OptimizerStep) for c in cmds)
    assert not any(isinstance(c, Interrupt | TrainMicroBatch) for c in cmds)
    assert all(st.trajs[t].status is TrajStatus.RUNNING for t in tail)
    # weights 1: batch 1 is released; the cut ones finish and are trained with step 1
    st.version = 1
    cmds = list(pol.on_event(TrainStepFinished(1), st))
    for t in tail:
        _finish(st, t)
    cmds = pol.on_event(TrajectoryFinished("T7", TrajStatus.DONE, 3), st)
    # (every trajectory here has one length: settle_auto waits for the instant to end)
    timers = [c for c in cmds if isinstance(c, SetTimer)]
    if timers:
        cmds = pol.on_event(TimerFired(timers[0].tag), st)
    (mb,) = [c for c in cmds if isinstance(c, TrainMicroBatch)]
    assert set(tail) <= set(mb.trajectories)
    assert pol.defers  # (it trains a cut trajectory with the next step)
    legality_check(st, mb, defers=pol.defers)  # legal: trained at version 1 from version 0 (staleness 1)


def test_no_cut_while_too_many_are_live():
    st, pol, sent = _start("elastic:staleness=1,cut=0.1", 8, 2, 8, 3)
    for t in sent[:6]:
        _finish(st, t)
    cmds = _to_train(st, pol, pol.on_event(TrajectoryFinished(sent[5], TrajStatus.DONE, 3), st))
    _train_all(st, cmds)
    cmds = pol.on_event(TrajectoryFinished(sent[5], TrajStatus.DONE, 3), st)
    assert not any(isinstance(c, OptimizerStep) for c in cmds)  # 2 of 8 live > 10%: wait


def test_an_idle_engine_steals_from_the_most_crowded():
    # 4 engines kept in rollout (min_engines=4): engine 0 empties while the others hold 3
    st, pol, sent = _start("elastic:steal=true,min_engines=4", 8, 2, 12, 2)
    on_0 = [t for t in sent if st.trajs[t].engine == 0]
    for t in on_0:
        _finish(st, t)
    cmds = pol.on_event(TrajectoryFinished(on_0[-1], TrajStatus.DONE, 3), st)
    (mv,) = [c for c in cmds if isinstance(c, Move)]
    assert mv.engine == 0 and len(mv.trajectories) == 1
    assert st.trajs[mv.trajectories[0]].engine == 1  # the most crowded (ties: lowest id)
    legality_check(st, mv)


def test_no_steal_when_off_or_nothing_is_crowded():
    st, pol, sent = _start("elastic:isolate=false,min_engines=4", 8, 2, 8, 2)
    for t in [t for t in sent if st.trajs[t].engine == 0]:
        _finish(st, t)
    assert not [c for c in pol.on_event(TrajectoryFinished(sent[0], TrajStatus.DONE, 3), st)
                if isinstance(c, Move)]
    st, pol, sent = _start("elastic:steal=true,isolate=false,min_engines=4", 8, 2, 8, 2)  # two per engine
    for t in [t for t in sent if st.trajs[t].engine == 0]:
        _finish(st, t)
    assert not [c for c in pol.on_event(TrajectoryFinished(sent[0], TrajStatus.DONE, 3), st)
                if isinstance(c, Move)]  # two on an engine is not crowded (_CROWDED = 3)


def _tail_waits(spec: str):
    """Step 0 of 8 trajectories on 4 engines: all but T3 and T7 (engine 3) finish and are
    trained; the policy's answer to the trainer waiting."""
    st, pol, sent = _start(spec, 8, 2, 8, 3)
    for t in sent:
        st.trajs[t].min_version = 0
        if t not in ("T3", "T7"):
            _finish(st, t)
    _train_all(st, _to_train(st, pol, pol.on_event(TrajectoryFinished("T5", TrajStatus.DONE, 3), st)))
    return st, pol, pol.on_event(TrajectoryFinished("T5", TrajStatus.DONE, 3), st)


def test_cut_stop_interrupts_keeping_progress_and_resumes_with_the_next_batch():
    st, pol, cmds = _tail_waits("elastic:staleness=1,cut=0.25,cut_stop=true")
    (stop,) = [c for c in cmds if isinstance(c, Interrupt)]
    assert sorted(stop.trajectories) == ["T3", "T7"] and stop.keep_progress
    assert any(isinstance(c, OptimizerStep) for c in cmds)  # step 0 does not wait for them
    for t in stop.trajectories:
        st.engines_[3].discard(t)
        st.mark_finished(t, TrajStatus.INTERRUPTED)
    # not resumed on weights 0 (they are trained with step 1): they wait for weights 1
    assert not [c for c in pol.on_event(TrajectoryFinished("T3", TrajStatus.INTERRUPTED, 2), st)
                if isinstance(c, Dispatch)]
    st.version = 1
    for e in st.engines_.values():
        e.version = 1
    cmds = pol.on_event(TrainStepFinished(1), st)
    resumed = {t for c in cmds if isinstance(c, Dispatch) for t in c.trajectories}
    assert resumed == {"T3", "T7"}  # first in the queue: the one engine left has room for 2


def test_no_cut_before_any_of_the_step_was_trained():
    # cut=1.0 with the rollout just started: the trainer waits, but for the whole step --
    # cutting now would move the entire batch to the next step
    st, pol, sent = _start("elastic:staleness=1,cut=1.0", 8, 2, 3, 3)  # engine 3 is empty
    assert all(st.trajs[t].engine != 3 for t in sent)
    st.remove_engine(3)  # ...and trains (idle: nothing has finished)
    for g in st.engine_gpus(3):
        st.roles[g] = Role.TRAIN
    assert not any(isinstance(c, OptimizerStep | Interrupt)
                   for c in pol.on_event(TrajectoryFinished("T0", TrajStatus.DONE, 3), st))


def _tail_of_four(spec: str) -> tuple[ClusterState, list]:
    """12 trajectories on 4 engines (3 each, T<i> on engine i % 4); engines 2 and 3 empty
    and engine 1 keeps one, so 4 are left (the step's tail), three of them on engine 0:
    T4 has run 7 turns, T0 and T8 one."""
    st, pol, _ = _start(spec, 8, 2, 12, 1)
    assert [st.trajs[f"T{i}"].engine for i in range(4)] == [0, 1, 2, 3]
    for t in ("T2", "T6", "T10", "T3", "T7", "T11", "T1", "T5"):
        _finish(st, t)
    st.trajs["T4"].turns_done = 7
    st.trajs["T0"].turns_done = st.trajs["T8"].turns_done = 1
    return st, [c for c in pol.on_event(TrajectoryFinished("T5", TrajStatus.DONE, 3), st) if isinstance(c, Move)]


def test_isolate_spreads_a_steps_tail_longest_first_to_the_least_loaded_engines():
    st, moves = _tail_of_four("elastic:isolate=true,steal=false,min_engines=4")
    # T4 (predicted longest: 7 turns and counting) leaves its crowded engine for an empty one,
    # then T8; T0 stays alone on engine 0 and T9 alone on engine 1 (no fewer companions elsewhere)
    assert [(m.trajectories, m.engine) for m in moves] == [(("T4",), 2), (("T8",), 3)]
    for m in moves:
        legality_check(st, m)


def test_isolate_is_on_by_default_and_false_turns_it_off():
    _, moves = _tail_of_four("elastic:steal=false,min_engines=4")
    assert [(m.trajectories, m.engine) for m in moves] == [(("T4",), 2), (("T8",), 3)]
    _, moves = _tail_of_four("elastic:isolate=false,steal=false,min_engines=4")
    assert moves == []


def test_isolate_waits_for_the_tail_then_evens_out_the_engines():
    # 2 engines, 12 trajectories (6 each, T<i> on engine i % 2); the tail is at most 2 per engine
    st, pol, _ = _start("elastic:isolate=true,steal=false,min_engines=2", 4, 2, 12, 1)
    for t in ("T1", "T3", "T5", "T7", "T9", "T11"):  # engine 1 empties; 6 unfinished > 4: not the tail yet
        _finish(st, t)
    assert not [c for c in pol.on_event(TrajectoryFinished("T11", TrajStatus.DONE, 3), st) if isinstance(c, Move)]
    for t in ("T0", "T2"):  # 4 unfinished, all on engine 0: two of them go to engine 1
        _finish(st, t)
    moves = [c for c in pol.on_event(TrajectoryFinished("T2", TrajStatus.DONE, 3), st) if isinstance(c, Move)]
    assert [m.engine for m in moves] == [1, 1]
    assert {st.trajs[t].engine for m in moves for t in m.trajectories} == {0}
