"""Finished live trajectories -> the trainer's GRPO samples, one micro-batch at a time.

Why baselines reach beyond the micro-batch: a policy may stream a step's trajectories to
the trainer as they finish, so one micro-batch can hold part of a task's group. The
advantage of each trajectory is normalised over every member of its group that has a
final reward *by then* (finished or already trained), not only over the members that
happen to share its micro-batch; with the whole group finished it is exactly GRPO.

Each sample also carries its tokens' staleness against the version the trainer holds when
the micro-batch runs (``st.version``: jobs run in order, so every earlier optimizer step
has been applied), and the behaviour log-probabilities the engines recorded.
"""

from __future__ import annotations

from rlsched.cluster.ids import TrajStatus
from rlsched.cluster.state import ClusterState
from rlsched.real.rollout.agent_loop import AgentTrajectory
from rlsched.real.train.grpo import Sample, grpo_samples
from rlsched.real.train.prefix_tree import charged_tokens

_SETTLED = frozenset({TrajStatus.DONE, TrajStatus.TIMED_OUT, TrajStatus.TRAINED})


def micro_batch_samples(
    trajs: dict[str, AgentTrajectory], st: ClusterState, tids: tuple[str, ...], *, processor: bool = False
) -> tuple[list[Sample], dict[str, int]]:
    """Samples for ``tids`` (those with at least one token) and the tokens each is
    charged for: its whole context (the trainer runs the forward pass over all of it), or
    with the ``processor`` the nodes of its group's prefix tree it adds (``prefix_tree.py``:
    what the trainer then runs; a shared prefix is charged once)."""
    wanted = set(tids)
    groups = {(trajs[t].step, trajs[t].task_id) for t in tids}
    members = [
        t for t in trajs.values()
        if (t.step, t.task_id) in groups and t.token_ids
        and (t.tid in wanted or st.trajs[t.tid].status in _SETTLED)
    ]
    samples = grpo_samples(members, version=st.version)  # the version the trainer holds now
    out, tids_out = [], []
    for t, s in zip(members, samples, strict=True):
        if t.tid in wanted:
            out.append(s)
            tids_out.append(t.tid)
    counts = (charged_tokens([s.token_ids for s in out], [s.group for s in out]) if processor
              else [len(s.token_ids) for s in out])
    return out, dict(zip(tids_out, counts, strict=True))
