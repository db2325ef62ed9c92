"""The trainer as the live driver sees it: one Ray actor per TRAIN slot (a data-parallel
rank running megatron-core on CPU or GPU), driven through :class:`TrainerGroup`.

The data-parallel width follows the slots the scheduling policy gives the trainer.
:meth:`TrainerGroup.resize` re-forms the gloo group with the new world size; ranks that
stay keep their weights and AdamW state, new ranks get both from rank 0, and gradients
already accumulated for the current step are folded into the new rank 0, so a resize
between micro-batches loses nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import ray

from rlsched.cluster.errors import InvariantViolation, LiveBackendError
from rlsched.real.train.grpo import Sample
from rlsched.real.train.megatron_model import read_hf_config
from rlsched.real.train.prefix_tree import charged_tokens, group_order
from rlsched.real.train.worker import TrainWorker

__all__ = ["Sample", "TrainerGroup"]


class _RankActor(TrainWorker):
    """The Ray actor: a :class:`TrainWorker` that learns its node's address itself."""

    def __init__(self, model_dir: str, **kw: object) -> None:
        super().__init__(model_dir, host=ray.util.get_node_ip_address(), **kw)  # type: ignore[arg-type]


def _split(samples: Sequence[Sample], world: int, *, whole_groups: bool = False) -> list[list[Sample]]:
    """Balance samples over ranks by token count (longest first to the lightest rank).
    ``whole_groups`` (the processor): a group's samples stay on one rank, so its prefix
    tree is packed in one pass, and groups are balanced by their packed length."""
    units: list[list[Sample]]
    if whole_groups:
        units = [[samples[i] for i in m] for m in group_order([s.group for s in samples]).values()]
    else:
        units = [[s] for s in samples]
    sizes = [sum(charged_tokens([s.token_ids for s in u], [s.group for s in u])) if whole_groups
             else len(u[0].token_ids) for u in units]
    parts: list[list[Sample]] = [[] for _ in range(world)]
    loads = [0] * world
    for size, unit in sorted(zip(sizes, units, strict=True), key=lambda x: x[0], reverse=True):
        rank = loads.index(min(loads))
        parts[rank].extend(unit)
        loads[rank] += size
    return parts


def _default_resources(slot: int) -> dict:
    """Placement for the rank on ``slot``: the Ray cluster helper's slot resource if it
    exists, else no constraint (a single-node test cluster)."""
    try:
        from rlsched.real.loop import ray_cluster
    except ImportError:
        return {}
    helper = getattr(ray_cluster, "slot_resources", None)
    return dict(helper(slot)) if callable(helper) else {}


def _off_policy_stats(stats: Sequence[dict], trained: int) -> dict:
    """The ranks' off-policy sums (``pg_loss.off_policy_loss_sum``) as one micro-batch's
    figures: how many trained tokens were stale, by how much, how often the behaviour
    weight was truncated or the PPO clip active, and the mean log behaviour ratio; the
    importance ratio ``pi_prox / pi_behav`` before truncation (mean, min, max) and the mean
    k3 KL to the starting policy per trained token (when the ranks computed it)."""
    total = {k: sum(r.get(k, 0.0) for r in stats) for k in
             ("stale_tokens", "staleness_sum", "weight_sum", "truncated_tokens", "clipped_tokens", "log_ratio_sum",
              "ratio_sum", "kl_sum")}
    stale = total["stale_tokens"]
    mins = [r["ratio_min"] for r in stats if "ratio_min" in r]
    maxs = [r["ratio_max"] for r in stats if "ratio_max" in r]
    extra: dict = {}
    if mins:
        extra.update(ratio_mean=total["ratio_sum"] / max(trained, 1), ratio_min=min(mins), ratio_max=max(maxs))
    if any("kl_sum" in r for r in stats):
        extra["kl_to_start"] = total["kl_sum"] / max(trained, 1)
    return {
        "stale_tokens": int(stale),
        "max_token_staleness": int(max((r.get("max_staleness", 0.0) for r in stats), default=0.0)),
        "mean_token_staleness": total["staleness_sum"] / max(trained, 1),
        "mean_behaviour_weight": total["weight_sum"] / max(trained, 1),
        "truncated_fraction": total["truncated_tokens"] / max(trained, 1),
        "clip_fraction": total["clipped_tokens"] / max(trained, 1),
        "stale_log_ratio_mean": total["log_ratio_sum"] / stale if stale else 0.0,
        **extra,
    }


class TrainerGroup:
    """Driver-side handle over the trainer ranks (one Ray actor per slot)."""

    def __init__(
        self,
        model_dir: str,
        slots: list[int],
        *,
        seed: int,
        lr: float = 1e-4,
        weight_decay: float = 0.0,
        max_grad_norm: float | None = 1.0,
        threads_per_rank: int = 1,
        num_cpus_per_rank: float = 0.0,
        gpus_per_rank: float | None = None,
        resources_for_slot: Callable[[int], dict] | None = None,
        processor: bool = False,
    ) -> None:
        if not ray.is_initialized():
            raise LiveBackendError("TrainerGroup: Ray is not initialised; start the cluster first")
        self.model_dir = str(Path(model_dir).resolve())
        read_hf_config(self.model_dir)  # fail fast, with the file named, on a bad checkpoint
        self._worker_kw = {
            "seed": seed,
            "lr": lr,
            "weight_decay": weight_decay,
            "max_grad_norm": max_grad_norm,
            "threads": threads_per_rank,
            "processor": processor,
        }
        self.processor = processor
        self._num_cpus = num_cpus_per_rank
        # None: one GPU per rank when the Ray cluster has GPUs (the slot is a GPU), else none.
        self._num_gpus = gpus_per_rank if gpus_per_rank is not None else (
            1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0
        )
        self._resources_for = resources_for_slot or _default_resources
        self._actor_cls = ray.remote(_RankActor)
        self._workers: dict[int, ray.actor.ActorHandle] = {}
        self.slots: list[int] = []
        self.version = 0
        self._pending_tokens = 0
        self.last_resize_seconds = 0.0
        self._check_slots(slots)
        self._spawn(slots)
        self._form(list(slots))

    # -- membership ---------------------------------------------------------------------

    @staticmethod
    def _check_slots(slots: Sequence[int]) -> None:
        if not slots or len(set(slots)) != len(slots):
            raise InvariantViolation(f"trainer: slots {list(slots)} must be a non-empty list without repeats")

    def _spawn(self, slots: Sequence[int]) -> None:
        for slot in slots:
            options: dict = {"num_cpus": self._num_cpus, "num_gpus": self._num_gpus}
            resources = self._resources_for(slot)
            if resources:
                options["resources"] = resources
            self._workers[slot] = self._actor_cls.options(**options).remote(self.model_dir, **self._worker_kw)

    def _form(self, order: list[int]) -> None:
        """Rendezvous a group over ``order`` (rank = index) and sync it from rank 0."""
        handles = [self._workers[s] for s in order]
        port = ray.get(handles[0].open_store.remote(len(order)))
        host = ray.get(handles[0].node_host.remote())
        ray.get([h.join.remote(rank, len(order), host, port) for rank, h in enumerate(handles)])
        ray.get([h.sync_from_rank0.remote() for h in handles])
        self.slots = order

    def resize(self, slots: list[int]) -> None:
        """Change the data-parallel width to ``len(slots)`` ranks on these slots."""
        self._check_slots(slots)
        if slots == self.slots:
            return
        start = time.perf_counter()
        survivors = [s for s in slots if s in self._workers]
        if not survivors:
            # No rank stays: bridge through the current rank 0, which hands over its state.
            self.resize([self.slots[0], *slots])
            self.resize(slots)
            self.last_resize_seconds = time.perf_counter() - start
            return
        newcomers = [s for s in slots if s not in self._workers]
        self._spawn(newcomers)  # starts loading while the old group folds its gradients
        order = survivors + newcomers
        old = [self._workers[s] for s in self.slots]
        ray.get([h.fold_pending.remote(s == order[0]) for s, h in zip(self.slots, old, strict=True)])
        for slot in [s for s in self.slots if s not in slots]:
            ray.kill(self._workers.pop(slot))
        self._form(order)
        self.last_resize_seconds = time.perf_counter() - start

    # -- training -----------------------------------------------------------------------

    def train_micro_batch(self, samples: list[Sample]) -> dict:
        """Forward and backward over ``samples`` split across the ranks; gradients accumulate
        until :meth:`optimizer_step`."""
        if not samples:
            raise InvariantViolation("trainer: train_micro_batch with no samples")
        start = time.perf_counter()
        parts = _split(samples, len(self.slots), whole_groups=self.processor)
        calls = [self._workers[s].forward_backward.remote(p) for s, p in zip(self.slots, parts, strict=True) if p]
        stats = ray.get(calls)
        trained = sum(r["trained_tokens"] for r in stats)
        self._pending_tokens += trained
        return {
            "samples": len(samples),
            "tokens": sum(r["tokens"] for r in stats),
            "forward_tokens": sum(r["forward_tokens"] for r in stats),
            "trained_tokens": trained,
            "loss": sum(r["loss_sum"] for r in stats) / max(trained, 1),
            "world": len(self.slots),
            "seconds": time.perf_counter() - start,
            "rank_seconds": [r["seconds"] for r in stats],
            **_off_policy_stats(stats, trained),
        }

    def optimizer_step(self) -> int:
        """All-reduce the step's gradients across ranks, apply AdamW; returns the new version."""
        if self._pending_tokens == 0:
            raise InvariantViolation("trainer: optimizer_step with no trained tokens since the last step")
        results = ray.get([self._workers[s].optimizer_step.remote() for s in self.slots])
        versions = {r["version"] for r in results}
        if len(versions) != 1:
            raise InvariantViolation(f"trainer: ranks disagree on the version after a step: {sorted(versions)}")
        self.version = versions.pop()
        self._pending_tokens = 0
        self.last_step = results[0]
        return self.version

    def loss(self, samples: list[Sample]) -> float:
        """Token-mean policy-gradient loss of ``samples`` under the current weights (rank 0)."""
        return ray.get(self._workers[self.slots[0]].loss.remote(samples))

    def digests(self) -> list[str]:
        """One hash of weights + optimizer state + version per rank (equal = in sync)."""
        return ray.get([self._workers[s].digest.remote() for s in self.slots])

    # -- weights out and checkpoints ----------------------------------------------------

    def export_hf_state_dict(self) -> dict:
        """Rank 0's weights with HF Llama names and layout, as CPU tensors."""
        return ray.get(self._workers[self.slots[0]].hf_state_dict.remote())

    def save_checkpoint(self, path: str | Path) -> None:
        """Weights, AdamW state and version, written by rank 0 (path visible to its node)."""
        ray.get(self._workers[self.slots[0]].save.remote(str(path)))

    def load_checkpoint(self, path: str | Path) -> None:
        """Rank 0 reads ``path``; every rank then receives its weights and optimizer state."""
        handles = [self._workers[s] for s in self.slots]
        ray.get([h.fold_pending.remote(False) for h in handles])  # a load discards a partial step
        self.version = ray.get(handles[0].load.remote(str(path)))
        ray.get([h.sync_from_rank0.remote() for h in handles])
        self._pending_tokens = 0

    def kill_ranks(self) -> int:
        """Kill every rank's process now (a ``[faults]`` trainer fault: the training job
        crashes); a call running on them fails. Returns how many were killed."""
        handles = list(self._workers.values())
        for handle in handles:
            ray.kill(handle)
        return len(handles)

    def shutdown(self) -> None:
        for handle in self._workers.values():
            ray.kill(handle)
        self._workers.clear()
        self.slots = []
