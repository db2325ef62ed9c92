"""``elastic``'s training side: what the trainer is sent, and how many GPUs its work is worth.

* **Train what has finished, as it finishes.** The trainer streams micro-batches of the
  step it is on at its current width; the optimizer step follows the step's last one,
  so with k=0 it is the step colocated would take, on the same trajectories.
* **A micro-batch waits for GPUs on their way** (``join``): a micro-batch runs on the GPUs
  the trainer has when it starts, so when a trajectory (typically the step's last, the
  longest) would finish sooner on the trainer after the engines switching to it arrive,
  at the measured rate and switch time, it waits for them.

Every figure comes from the policy's :class:`~rlsched.policies.meter.Meter` (event times of
this run); before a figure was measured the answers here say so (no wait, no gain).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rlsched.cluster.commands import Command, Reassign
from rlsched.cluster.ids import Role
from rlsched.cluster.view import ClusterView

from ..meter import Meter
from .config import ElasticConfig
from .switches import switching_to_train

# ``join`` waits whenever the measured rate and switch time say the micro-batch ends sooner
# after the GPUs arrive. Until 2026-12 it waited only for a saving of more than half a
# (measured) switch, against estimate error (the rate is a mean per token, the switch the
# last one measured); re-measured on the policy of that release, the margin cost time
# everywhere it acted: without it 0-1.2% faster at the elastic bench's six k=1 points
# (none slower), equal or faster at the regime map's twelve, and closer to the baseline in
# 71 of 140 sampled no-harm cases (4 within 0.03 points worse, all far ahead of it) -- the
# trainer runs one job at a time, so a micro-batch started on too few GPUs also holds back
# every GPU that arrives while it runs (on-policy, 3 single-GPU engines, uniform lengths:
# 1.7% behind colocated with the margin, 0.3% without).


@dataclass(frozen=True)
class MicroBatch:
    """A micro-batch the trainer may be sent (the loop counts it only once it sends it)."""

    trajectories: tuple[str, ...]
    tokens: int
    whole: bool = False  # every ready trajectory of the step: no GPU was expected to join


class Training:
    """The trainer's side of the policy's decisions, from the config and the meter; the
    loop owns the step's progress and hands in what these answers depend on. ``steps``:
    the steps whose finished trajectories the trainer has still to train."""

    def __init__(self, config: ElasticConfig, meter: Meter) -> None:
        self._config = config
        self._meter = meter

    def backlog(self, view: ClusterView, steps: range) -> int:
        """Finished trajectories the trainer has not been sent yet (its step and later)."""
        return sum(len(view.finished(s)) for s in steps)

    def ready_seconds(self, view: ClusterView, steps: range, gpus: int) -> float:
        """Seconds the trainer needs, on ``gpus`` GPUs, for the finished work it has not
        been sent (measured rate; before the first micro-batch was timed, none: the
        trainer's own GPUs go first, and the next event knows the rate)."""
        rate = self._meter.train_gpu_s_per_token
        if rate is None:
            return 0.0
        ready = [t for s in steps for t in view.finished(s)]
        return sum(view.trajectory(t).tokens for t in ready) * rate / max(1, gpus)

    def gains(self, view: ClusterView, steps: range, have: int, add: int, back: bool = True) -> bool:
        """Does the trainer (``have`` GPUs) finish what is ready sooner by more than a
        switch (``back``: the GPUs must switch back for a later batch; else by anything) if
        ``add`` GPUs join it after their switch (measured times; before the first
        micro-batch was timed, no: its own GPUs go first)? The micro-batch running now
        (its measured time left) goes first on the trainer's own GPUs: GPUs that arrive
        while it runs start with the ready work, so a busy trainer gains more."""
        sw = self._meter.switch_s
        work = self.ready_seconds(view, steps, have)
        if sw is None:
            return work > 0
        busy = self._meter.busy_s(view.now)
        alone = busy + work
        if alone <= sw:
            return False
        # (the ready work starts when the running micro-batch ends; what of it the trainer
        # does alone before they arrive, then the rest on all)
        joined = max(sw, busy) + (work - max(0.0, sw - busy)) * have / (have + add)
        return alone - joined > (sw if back else 0.0)

    def keep(self, view: ClusterView, steps: range) -> int:
        """GPUs the trainer keeps when a new batch takes engines back: enough to train its
        backlog within ``train_within`` of the time the last batch's rollout took,
        measured; ``train_share`` of the GPUs until both were measured. (1.0, the default,
        sizes the trainer so that neither side waits for the other on average; with
        staleness the trainer's step end releases a later batch, so its backlog is on the
        critical chain, and 0.4 measured 2-8% faster at 5 of the elastic bench's 6 k=1
        points -- but slower on the regime map's training-heavy points.)"""
        ready = [t for s in steps for t in view.finished(s)]
        if not ready:
            return 0
        m = self._meter
        if m.train_gpu_s_per_token is None or not m.rollout_s:
            keep = round(self._config.train_share * view.num_gpus)
        else:
            tokens = sum(view.trajectory(t).tokens for t in ready)
            within = self._config.train_within * m.rollout_s
            keep = min(math.ceil(tokens * m.train_gpu_s_per_token / within), view.num_gpus - view.tp)
        # a trainer kept at all is kept at its memory floor (below it, it runs nothing)
        return max(keep, view.trainer().min_gpus) if keep > 0 else 0

    def micro_batch(self, view: ClusterView, gpus: int, ready: tuple[str, ...],
                    to_train: Mapping[tuple[int, ...], float], whole: bool = False,
                    more: bool = False) -> MicroBatch | None:
        """The next micro-batch of the ``ready`` trajectories for a trainer of ``gpus``
        GPUs, or none while it waits (``join``) for the groups ``to_train`` (GPUs -> when
        sent) on their way: their RolesChanged starts it on the larger trainer. ``whole``:
        no GPU can join a later micro-batch (none is on its way to the trainer, and either
        the step's rollout is over and nothing rolls out or waits to, or a held split's
        trainer is at its side), so every ready trajectory goes in one, as colocated and async train a
        step: each micro-batch pays a gradient reduction. On a trace with no length spread,
        where the whole step finishes at once, micro-batches of one trajectory per GPU put
        on-policy elastic 4.6% behind colocated with the default preset (32 GPUs, 128
        trajectories a step: 310.2 vs 296.6 s, now equal), and staleness-1 elastic, holding
        async's own split, 18.9% behind the best async (now 11.1%: what is left is the
        switches before the split was held)."""
        # A micro-batch runs on the GPUs the trainer has when it starts; GPUs that join
        # later wait for the next one, so micro-batches are small (one trajectory per
        # GPU by default): every GPU that arrives starts within one of them.
        # While more GPUs are on their way to the trainer, what ends before they arrive
        # (at least one trajectory), so they join within one trajectory's training.
        if not whole:
            ready = self._before_arrival(view, gpus, ready, to_train, more) if to_train \
                else ready[:self._config.micro * gpus]
        if not ready:
            return None  # (nothing ends before GPUs on their way arrive: it waits for them)
        tokens = sum(view.trajectory(t).tokens for t in ready)
        if more and self._too_small(gpus, tokens):
            return None
        if to_train and self.sooner_joined(view, gpus, tokens, to_train):
            return None
        return MicroBatch(ready, tokens, whole)

    def _too_small(self, gpus: int, tokens: int) -> bool:
        """Would a micro-batch of ``tokens`` spend less of its time training them than its
        fixed part (measured: the gradient reduction every micro-batch pays)? While more of
        the step is to come, it then waits for more work: starting it now saves at most its
        training seconds, less than the fixed part a later, larger micro-batch pays once for
        both. On a trace with no length spread the step's first trajectory to finish went
        alone (its siblings finish in the same instant, but one event at a time), one extra
        reduction per step on a trainer that was the bottleneck."""
        m = self._meter
        rate = m.marginal_gpu_s_per_token
        return rate is not None and gpus > 0 and tokens * rate / gpus < m.micro_batch_s(gpus)

    def _before_arrival(self, view: ClusterView, gpus: int, ready: tuple[str, ...],
                        to_train: Mapping[tuple[int, ...], float], more: bool = True) -> tuple[str, ...]:
        """While GPUs are on their way to the trainer: the ready trajectories (at least one,
        at most ``micro`` per GPU) whose micro-batch, at the measured rate, ends before the
        first group arrives -- a GPU that arrives then starts within one trajectory's
        training, and every micro-batch pays its own gradient reduction, so one that ends
        before anything could join loses nothing by being larger. Until 2026-12 it was always
        one trajectory: on short steps (a few thousand tokens each, a role switch of ~9 s
        under the default preset) a step trained one reduction per trajectory while the
        GPUs switching to it were seconds away, and staleness-1 elastic was up to 21% behind
        the best async on traces with no length spread.

        None at all (it waits for the GPUs on their way) when they are due before even a
        micro-batch's fixed part would end, or, on-policy once the step's rollout is over
        (``more`` false: everything left trains now), before its first trajectory would:
        a step's last engines reach the trainer a few hundredths of a second apart (each
        sent as its last trajectory finished), and a one-trajectory micro-batch started on
        the first of them made the step pay a second gradient reduction -- on-policy
        elastic up to 1.44% behind colocated on ``uniform`` traces, 3, 1 and 0 of three
        40-case samples over 1% (session 18; now none, worst 0.55%). (With staleness, the
        second clause put the shipped trace's 64-GPU point 0.9% behind: not there. With
        ``join=false`` it starts at once, as before.)"""
        m = self._meter
        rate, sw = m.marginal_gpu_s_per_token, m.switch_s
        if rate is None or sw is None or gpus <= 0:
            return ready[:1]
        arrive = min(sent + sw for sent in to_train.values())
        room = (arrive - view.now - m.micro_batch_s(gpus)) * gpus / rate  # tokens that fit before it
        n, used = 0, 0
        for t in ready[:self._config.micro * gpus]:
            used += view.trajectory(t).tokens
            if used > room:
                break
            n += 1
        if self._config.join and (room <= 0 or (not n and not more and not self._config.staleness)) \
                and any(switching_to_train(view, k) for k in to_train):
            return ()  # (it waits for them: see the docstring)
        return ready[:max(1, n)]

    def withhold(self, view: ClusterView, gpus: int, mb: MicroBatch, released: Sequence[Command],
                 to_train: Mapping[tuple[int, ...], float]) -> bool:
        """``join`` for engines ``released`` to the trainer in the same decision as ``mb``
        (the step's last trajectory finishing empties an engine): does it wait, to start
        when they arrive, because it would finish sooner on them?"""
        fresh = frozenset(c.gpus for c in released if isinstance(c, Reassign) and c.role is Role.TRAIN)
        return bool(fresh) and self.sooner_joined(view, gpus, mb.tokens, to_train, fresh)

    def sooner_joined(self, view: ClusterView, gpus: int, tokens: int,
                      to_train: Mapping[tuple[int, ...], float],
                      fresh: frozenset[tuple[int, ...]] = frozenset()) -> bool:
        """``join``: would a micro-batch of ``tokens`` finish sooner if it waited for the GPUs on
        their way to the trainer (each group of ``to_train`` due a measured switch after it
        was sent) than started now on the trainer's ``gpus``? Only groups still switching
        count (their arrival is reported: the wait ends), and ``fresh`` ones, sent in this
        decision. (Unmeasured rate or switch: no.)"""
        m = self._meter
        rate, sw = m.train_gpu_s_per_token, m.switch_s
        if not self._config.join or rate is None or sw is None or gpus <= 0:
            return False
        work = tokens * rate
        now_end = view.now + work / gpus
        joined = gpus
        for sent, n in sorted((t, len(k)) for k, t in to_train.items()
                              if k in fresh or switching_to_train(view, k)):
            joined += n  # (a group still switching reports its arrival: the wait ends)
            if max(view.now, sent + sw) + work / joined < now_end:
                return True
        return False
