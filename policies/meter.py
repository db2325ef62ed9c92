"""What a policy can measure about the cluster by watching it: how long a role switch
takes, how many GPU-seconds training costs per token, how long a batch's rollout lasts.

Moving GPUs pays only when it saves more than the switch costs, and sizing the trainer
needs its speed; neither is in the view (the cost model belongs to the driver). A real
scheduler times what it sees, so the policy does too: every figure here comes from event
times (``view.now``) of this run, and is ``None`` until it was first seen.
"""

from __future__ import annotations

from rlsched.cluster.ids import GpuId, Role

#: micro-batches the training rate is fitted over (recent ones: the workload drifts)
_FIT_WINDOW = 8


def _fit(timed: list[tuple[int, float, float]]) -> tuple[float, dict[int, float]]:
    """(marginal GPU-seconds per token, fixed seconds per micro-batch by trainer width)
    from recent micro-batches' (GPUs, tokens per GPU, seconds): least-squares lines of one
    slope, the marginal rate, and an intercept per width, what a micro-batch costs whatever
    its size (the gradient reduction: none on one replica, more as the data-parallel ranks
    grow). Until some width timed micro-batches of two sizes the parts cannot be told apart:
    the lowest seconds per token timed, with no fixed part known (a one-trajectory
    micro-batch is mostly its fixed part). A slope that is not
    positive gives the lowest seconds per token too; a negative intercept (FLOPs per token
    grow with a trajectory's length, so long-tailed micro-batches curve upward), none.

    Only the size of a micro-batch is chosen from these (:mod:`~rlsched.policies.elastic.
    training`): sizing the trainer by the marginal rate instead of the newest micro-batch's
    seconds per token (which its fixed part is in: the trainer pays one per micro-batch)
    kept too few GPUs training at the regime map's training-heavy points (the 2.4T MoE at
    tail weight 0.35: 15% slower at 1024 GPUs, 6% at 4096)."""
    lowest = min(y / x for _, x, y in timed)  # (x > 0: a timed micro-batch has tokens)
    groups: dict[int, list[tuple[float, float]]] = {}
    for g, x, y in timed:
        groups.setdefault(g, []).append((x, y))
    means = {g: (sum(x for x, _ in v) / len(v), sum(y for _, y in v) / len(v)) for g, v in groups.items()}
    var = sum((x - means[g][0]) ** 2 for g, v in groups.items() for x, _ in v)
    cov = sum((x - means[g][0]) * (y - means[g][1]) for g, v in groups.items() for x, y in v)
    if var <= 1e-12 * max(1.0, max(x * x for _, x, _ in timed)):
        return lowest, {}
    slope = cov / var
    if slope <= 0:
        return lowest, {}
    fixed = {g: max(0.0, my - slope * mx) for g, (mx, my) in means.items()}
    return slope, fixed


class Meter:
    """Running measurements of one run (the newest, or a few recent ones: the workload drifts)."""

    def __init__(self) -> None:
        self._switches: dict[tuple[tuple[GpuId, ...], Role | None], float] = {}
        self.switch_s: float | None = None
        self._mb: tuple[float, int, int] | None = None  # (started, GPUs, tokens)
        self._timed: list[tuple[int, float, float]] = []  # recent: (GPUs, tokens per GPU, s)
        self.train_gpu_s_per_token: float | None = None  # the newest micro-batch's, all told
        self.marginal_gpu_s_per_token: float | None = None  # fitted: the fixed part excluded
        self._fixed: dict[int, float] = {}  # fixed seconds of a micro-batch, by trainer width
        self.step_tokens: int | None = None  # tokens the last optimizer step trained
        self._step_sent = 0  # tokens sent to micro-batches since the last optimizer step
        self._released: dict[int, float] = {}
        self.rollout_s: float | None = None

    # ---------------------------------------------------------------- switches
    def switch_sent(self, gpus: tuple[GpuId, ...], now: float, role: Role | None = None) -> None:
        self._switches[gpus, role] = now

    def switch_done(self, gpus: tuple[GpuId, ...], now: float, role: Role | None = None) -> None:
        """GPUs reported their switch to ``role`` done. Only switches sent to that role
        match: a driver may report a switch after the policy sent the same GPUs on to
        another role (a new engine's EngineIdle comes first), and that second switch has
        not ended (matching it would measure a switch of 0 s)."""
        arrived = set(gpus)
        for key in [k for k in self._switches if arrived.intersection(k[0]) and role in (None, k[1])]:
            sent = self._switches.pop(key)
            self.switch_s = now - sent

    # ---------------------------------------------------------------- training
    def micro_batch_sent(self, gpus: int, tokens: int, now: float) -> None:
        """A micro-batch starts now (sent to an idle trainer) on ``gpus`` GPUs."""
        self._mb = (now, gpus, tokens)
        self._step_sent += tokens

    def busy_s(self, now: float) -> float:
        """Seconds the running micro-batch has left at the newest measured rate (0: none
        running, or nothing measured yet)."""
        if self._mb is None or self.train_gpu_s_per_token is None:
            return 0.0
        started, gpus, tokens = self._mb
        return max(0.0, started + tokens * self.train_gpu_s_per_token / max(1, gpus) - now)

    def micro_batch_done(self, now: float) -> None:
        if self._mb is None:
            return
        started, gpus, tokens = self._mb
        self._mb = None
        if tokens > 0 and now > started:
            self._timed = [*self._timed[1 - _FIT_WINDOW:], (gpus, tokens / gpus, now - started)]
            self.train_gpu_s_per_token = (now - started) * gpus / tokens
            self.marginal_gpu_s_per_token, self._fixed = _fit(self._timed)

    def micro_batch_s(self, gpus: int) -> float:
        """Fixed seconds of a micro-batch on ``gpus`` GPUs (its gradient reduction): 0 until
        measured at that width."""
        return self._fixed.get(gpus, 0.0)

    def step_trained(self) -> None:
        """An optimizer step ended: its step trained the tokens sent since the last one (an
        empty step measures nothing: the last measured step stands)."""
        if self._step_sent > 0:
            self.step_tokens = self._step_sent
        self._step_sent = 0

    def step_train_gpu_s(self) -> float | None:
        """GPU-seconds the last step's training took at the measured rate (``None`` until
        a micro-batch was timed and a step was trained)."""
        if self.step_tokens is None or self.train_gpu_s_per_token is None:
            return None
        return self.step_tokens * self.train_gpu_s_per_token

    # ----------------------------------------------------------------- rollout
    def batch_released(self, step: int, now: float) -> None:
        self._released.setdefault(step, now)

    def batch_done(self, step: int, now: float) -> None:
        """The last trajectory of ``step`` finished."""
        start = self._released.pop(step, None)
        if start is not None:
            self.rollout_s = now - start
