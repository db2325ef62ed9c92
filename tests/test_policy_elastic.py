"""``elastic`` without a driver: the policy is driven by hand on a real ClusterState."""

import random

from rlsched.cluster.commands import Dispatch, Reassign, TrainMicroBatch
from rlsched.cluster.events import RolesChanged, RunStarted, TrainStepFinished, TrajectoryFinished
from rlsched.cluster.ids import Role, TrajStatus
from rlsched.cluster.state import ClusterState, EngineState
from rlsched.policies import make_policy


def _rolling_out(gpus: int, tp: int, n: int, spec: str = "elastic", steps: int = 1) -> tuple[ClusterState, object]:
    """Every GPU rolls out and the batches the policy's staleness allows (``n``
    trajectories each, ``T<step*n+i>``) are dispatched, round-robin over the engines."""
    batches = [[(f"T{s * n + i}", "task") for i in range(n)] for s in range(steps)]
    pol = make_policy(spec)
    st = ClusterState(gpus, tp, batches, max_staleness=pol.max_staleness)
    pol.reset(st, random.Random(0))
    (cmd,) = pol.on_event(RunStarted(), st)
    assert isinstance(cmd, Reassign) and cmd.role is Role.ROLLOUT
    for g in cmd.gpus:
        st.roles[g] = Role.ROLLOUT
    for e in range(gpus // tp):
        st.add_engine(EngineState(e, st.engine_gpus(e), 0, 1000))
    sent = pol.on_event(RolesChanged(cmd.gpus, Role.ROLLOUT), st)
    assert all(isinstance(d, Dispatch) for d in sent)
    tids = [t for d in sent for t in d.trajectories]
    assert len(tids) == n * min(steps, pol.max_staleness + 1)
    for i, tid in enumerate(tids):
        st.mark_active(tid, TrajStatus.RUNNING, i % (gpus // tp))
        es = st.engines_[i % (gpus // tp)]
        es.enqueue(tid)
        es.dequeue(admit=True)
    return st, pol


def _finish(st: ClusterState, tid: str) -> None:
    st.engines_[st.trajs[tid].engine].discard(tid)
    st.mark_finished(tid, TrajStatus.DONE)


def test_micro_batches_are_sized_to_the_trainer_while_it_grows():
    # 16 GPUs (8 engines of 2), 32 trajectories; 30 finish, so the policy packs the 2 live
    # ones and hands the freed engines to the trainer. A micro-batch of all 30 ready
    # trajectories would hold those few GPUs for the whole step's training while engines
    # released later wait for it; a micro-batch is one trajectory per trainer GPU.
    st, pol = _rolling_out(16, 2, 32)
    for i in range(30):
        _finish(st, f"T{i}")
    cmds = pol.on_event(TrajectoryFinished("T29", TrajStatus.DONE, 5), st)
    (release,) = [c for c in cmds if isinstance(c, Reassign)]
    assert release.role is Role.TRAIN and release.drain.value == "migrate"
    for g in release.gpus:
        st.roles[g] = Role.TRAIN
    cmds = pol.on_event(RolesChanged(release.gpus, Role.TRAIN), st)
    (mb,) = [c for c in cmds if isinstance(c, TrainMicroBatch)]
    g = len(release.gpus)
    assert g < 16 and len(mb.trajectories) == g  # micro=1: one trajectory per trainer GPU
    assert mb.trajectories == tuple(f"T{i}" for i in range(g))  # in finish order


def test_micro_sets_the_micro_batch_size_per_trainer_gpu():
    st, pol = _rolling_out(16, 2, 32, "elastic:micro=3")
    for i in range(30):
        _finish(st, f"T{i}")
    (release,) = [c for c in pol.on_event(TrajectoryFinished("T29", TrajStatus.DONE, 5), st)
                  if isinstance(c, Reassign)]
    for g in release.gpus:
        st.roles[g] = Role.TRAIN
    (mb,) = [c for c in pol.on_event(RolesChanged(release.gpus, Role.TRAIN), st)
             if isinstance(c, TrainMicroBatch)]
    assert len(mb.trajectories) == min(30, 3 * len(release.gpus))


def test_no_micro_batch_is_queued_for_trainer_gpus_that_are_leaving():
    # staleness 1: batches 0 and 1 roll out together; batch 0 is trained on GPUs 6-7 (the
    # engines the tail freed) while 4 of batch 1 are still rolling out. When step 0's
    # optimizer step ends, the trainer's GPUs go back to rollout; a micro-batch of batch 1
    # queued in that same moment would wait for the trainer's *next* GPUs and then hold
    # however few those are for all of it. It waits for them instead.
    st, pol = _rolling_out(8, 1, 8, "elastic:staleness=1", steps=2)
    for i in [*range(8), 12, 13, 14, 15]:  # T8-T11 still run, on engines 0-3
        _finish(st, f"T{i}")
    for e in (6, 7):
        assert not st.engines_[e].running
        st.remove_engine(e)
        st.roles[e] = Role.TRAIN
    pol._switching = 0
    pol._train_step, pol._in_micro, pol._opt_sent = 0, 8, True  # step 0 trained, optimizer sent
    for tid in [f"T{i}" for i in range(8)]:
        st.trajs[tid].in_micro_batch = True
    st.mark_trained([f"T{i}" for i in range(8)], 0)
    st.version = 1
    cmds = pol.on_event(TrainStepFinished(1), st)
    back = [c for c in cmds if isinstance(c, Reassign)]
    assert back and back[0].role is Role.ROLLOUT and set(back[0].gpus) == {6, 7}
    assert not [c for c in cmds if isinstance(c, TrainMicroBatch)]


def test_on_policy_every_gpu_trains_once_the_rollout_is_over():
    # min_engines=2 keeps 2 engines through the tail; when the last trajectory finishes
    # nothing can roll out before the optimizer step, so those go to the trainer too.
    st, pol = _rolling_out(8, 2, 8, "elastic:min_engines=2")
    for i in range(7):
        _finish(st, f"T{i}")
    for c in pol.on_event(TrajectoryFinished("T6", TrajStatus.DONE, 2), st):
        if isinstance(c, Reassign):
            for g in c.gpus:
                st.roles[g] = Role.TRAIN
                if st.engine_of(g) in st.engines_:
                    st.remove_engine(st.engine_of(g))
            pol.on_event(RolesChanged(c.gpus, Role.TRAIN), st)
    assert len(st.engines()) == 2  # the tail keeps min_engines
    _finish(st, "T7")
    cmds = pol.on_event(TrajectoryFinished("T7", TrajStatus.DONE, 3), st)
    (release,) = [c for c in cmds if isinstance(c, Reassign)]
    assert release.role is Role.TRAIN
    assert set(release.gpus) == {g for e in st.engines() for g in st.engine_gpus(e)}
