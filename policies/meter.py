"""What a policy can measure about the cluster by watching it: how long a role switch
takes, how many GPU-seconds training costs per token, how long a batch's rollout lasts.

Moving GPUs pays only when it saves more than the switch costs, and sizing the trainer
needs its speed; neither is in the view (the cost model belongs to the driver). A real
scheduler times what it sees, so the policy does too: every figure here comes from event
times (``view.now``) of this run, and is ``None`` until it was first seen.
"""

from __future__ import annotations

from rlsched.cluster.ids import GpuId, Role


class Meter:
    """Running measurements of one run (the newest observation wins: the workload drifts)."""

    def __init__(self) -> None:
        self._switches: dict[tuple[tuple[GpuId, ...], Role | None], float] = {}
        self.switch_s: float | None = None
        self._mb: tuple[float, int, int] | None = None  # (started, GPUs, tokens)
        self.train_gpu_s_per_token: float | None = None
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

    def micro_batch_done(self, now: float) -> None:
        if self._mb is None:
            return
        started, gpus, tokens = self._mb
        self._mb = None
        if tokens > 0 and now > started:
            self.train_gpu_s_per_token = (now - started) * gpus / tokens

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
