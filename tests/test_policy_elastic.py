"""``elastic`` without a driver: the policy is driven by hand on a real ClusterState."""

import random

from rlsched.cluster.commands import Dispatch, Reassign, TrainMicroBatch
from rlsched.cluster.events import RolesChanged, RunStarted, TrajectoryFinished
from rlsched.cluster.ids import Role, TrajStatus
from rlsched.cluster.state import ClusterState, EngineState
from rlsched.policies import make_policy


def _rolling_out(gpus: int, tp: int, n: int) -> tuple[ClusterState, object]:
    """Every GPU rolls out and batch 0 (``n`` trajectories) is dispatched."""
    st = ClusterState(gpus, tp, [[(f"T{i}", "task") for i in range(n)]], max_staleness=0)
    pol = make_policy("elastic")
    pol.reset(st, random.Random(0))
    (cmd,) = pol.on_event(RunStarted(), st)
    assert isinstance(cmd, Reassign) and cmd.role is Role.ROLLOUT
    for g in cmd.gpus:
        st.roles[g] = Role.ROLLOUT
    for e in range(gpus // tp):
        st.engines_[e] = EngineState(e, st.engine_gpus(e), 0, 1000)
    (d,) = pol.on_event(RolesChanged(cmd.gpus, Role.ROLLOUT), st)
    assert isinstance(d, Dispatch) and len(d.trajectories) == n
    for i, tid in enumerate(d.trajectories):
        st.mark_active(tid, TrajStatus.RUNNING, i % (gpus // tp))
        st.engines_[i % (gpus // tp)].running.add(tid)
    return st, pol


def _finish(st: ClusterState, tid: str) -> None:
    st.engines_[st.trajs[tid].engine].running.discard(tid)
    st.mark_finished(tid, TrajStatus.DONE)


def test_micro_batches_are_sized_to_the_trainer_while_it_grows():
    # 16 GPUs (8 engines of 2), 32 trajectories; 30 finish, so the policy packs the 2 live
    # ones and hands the freed engines to the trainer. A micro-batch of all 30 ready
    # trajectories would hold those few GPUs for the whole step's training while engines
    # released later wait for it; each trainer GPU takes at most its share: 32/16 = 2.
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
    share = -(-32 * len(release.gpus) // 16)
    assert len(release.gpus) < 16 and len(mb.trajectories) == share < 30
    assert mb.trajectories == tuple(f"T{i}" for i in range(share))  # in finish order
