"""Finished live trajectories -> the trainer's GRPO samples, one micro-batch at a time.

Why a trajectory may wait for its group: a policy may stream a step's trajectories to the
trainer as they finish (elastic sends one per trainer GPU), so one micro-batch can hold
part of a task's group. GRPO's baseline is the *whole* group's reward mean and spread; a
baseline over the members finished so far is a different estimator -- the first member of
a group to finish was normalised against itself alone (advantage 0, its signal lost), the
next ones against early finishers only, and which members those were depends on timing, so
the same seed trained differently run to run (measured on issue #25's elastic k=1 runs:
4-15% of the trained samples got a partial-group advantage). :class:`GroupHold` therefore
keeps a trajectory whose group has members still generating until the group settles, and
trains it then, within the same optimizer step: the weights do not change between a
step's micro-batches, so training it later in the step gives exactly the gradient it would
have had with the full group known. Members that cannot settle before the step ends (a
tail the policy cut into the next step, a dropped member) are trained at the optimizer
step with the members settled by then (``flush``) -- the step never waits on them.

Each sample also carries its tokens' staleness against the version the trainer holds when
the micro-batch runs (``st.version``: jobs run in order, so every earlier optimizer step
has been applied), and the behaviour log-probabilities the engines recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rlsched.cluster.ids import TrajStatus
from rlsched.cluster.state import ClusterState
from rlsched.real.rollout.agent_loop import AgentTrajectory
from rlsched.real.train.grpo import Sample, grpo_samples
from rlsched.real.train.prefix_tree import charged_tokens

_SETTLED = frozenset({TrajStatus.DONE, TrajStatus.TIMED_OUT, TrajStatus.TRAINED})


def micro_batch_samples(
    trajs: Mapping[str, AgentTrajectory], st: ClusterState, tids: Iterable[str], *, processor: bool = False
) -> tuple[list[Sample], dict[str, int]]:
    """Samples for ``tids`` (those with at least one token) and the tokens each is
    charged for: its whole context (the trainer runs the forward pass over all of it), or
    with the ``processor`` the nodes of its group's prefix tree it adds (``prefix_tree.py``:
    what the trainer then runs; a shared prefix is charged once). Advantages are
    normalised over every member of each group that has a final reward by now (finished
    or already trained) -- the whole group once it settled."""
    wanted = set(tids)
    groups = {(trajs[t].step, trajs[t].task_id) for t in wanted}
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


def group_settled(trajs: Mapping[str, AgentTrajectory], st: ClusterState, tid: str,
                  sent: set[str] | frozenset[str] = frozenset()) -> bool:
    """Every member of ``tid``'s group has its final reward: finished, timed out, already
    trained, or among ``sent`` (given to the trainer, so finished)."""
    me = trajs[tid]
    return all(t.tid in sent or st.trajs[t.tid].status in _SETTLED
               for t in trajs.values() if t.step == me.step and t.task_id == me.task_id)


class GroupHold:
    """The trajectories sent to the trainer whose group has not settled yet (module
    docstring). One per live run; empty at every optimizer step's end."""

    def __init__(self) -> None:
        self._held: list[str] = []
        self.flushed_tokens: dict[str, int] = {}  # what the last flush trained (see take)

    @property
    def held(self) -> tuple[str, ...]:
        return tuple(self._held)

    def take(self, trajs: Mapping[str, AgentTrajectory], st: ClusterState,
             tids: Iterable[str], *, processor: bool = False) -> tuple[list[Sample], dict[str, int]]:
        """A micro-batch of ``tids``: samples of those (and of earlier held ones) whose
        group has settled, with full-group advantages; the rest wait. The tokens dict
        charges every trajectory of ``tids`` now (the policy sent them; their record does
        not depend on when the gradient is computed) -- except with the ``processor``,
        whose charge depends on what is packed together: then it charges the samples
        trained now, and :meth:`flush` the held ones (``flushed_tokens``)."""
        tids = list(tids)
        pool = [*self._held, *tids]
        sent = set(pool)
        ready = [t for t in pool if group_settled(trajs, st, t, sent)]
        waiting = set(pool) - set(ready)
        self._held = [t for t in pool if t in waiting]
        samples, charged = micro_batch_samples(trajs, st, ready, processor=processor) if ready else ([], {})
        if processor:
            return samples, charged
        return samples, {t: len(trajs[t].token_ids) for t in tids if trajs[t].token_ids}

    def flush(self, trajs: Mapping[str, AgentTrajectory], st: ClusterState, *,
              processor: bool = False) -> list[Sample]:
        """Samples of every held trajectory, normalised over the members settled by now
        (the optimizer step is next: it cannot wait for the rest)."""
        held, self._held = self._held, []
        samples, self.flushed_tokens = micro_batch_samples(trajs, st, held, processor=processor) if held else ([], {})
        return samples

    def clear(self) -> None:
        """Forget the held trajectories (a trainer crash re-runs the step's micro-batches)."""
        self._held = []
