"""One data-parallel rank of the trainer: a megatron-core GPTModel, its AdamW state, and
the gloo group it shares with the other ranks. ``trainer.py`` runs it as a Ray actor.

Gradient bookkeeping, chosen so that a step's result does not depend on how its samples
were split into micro-batches or across ranks, nor on resizes in the middle of a step:
each rank accumulates the *sum* of per-token losses' gradients and counts its trained
tokens; ``optimizer_step`` all-reduces both and divides, giving exactly the gradient of
the token-mean loss over the whole step. A resize first folds the pending gradients of
the old group into the new group's rank 0.

Every rank applies the same all-reduced gradient to the same weights with the same AdamW
state, so the ranks stay bit-identical without broadcasting weights after each step
(``digest`` lets tests check it). New ranks get weights, optimizer state and version by
broadcast from rank 0 when the group is re-formed.

KL to the starting policy: each rank keeps a frozen copy of the weights it was built from
(``model_dir``: the run's version 0, warm-started or not; a resumed or restarted trainer
rebuilds it from the same folder, so it never drifts) and runs it forward on every trained
chunk under ``no_grad``; the loss's stats then carry the k3 estimate of ``KL(pi || pi_0)``
summed over the trained tokens (``pg_loss.k3_kl_sum``). Why this and not the behaviour
log-probabilities of version-0 samples: those exist only for tokens generated at version
0, i.e. for the first step's prompts, not for the tokens trained later, so they cannot
estimate the KL on the current policy's samples. The copy costs one forward pass per
chunk (about a third of a forward + backward) and one more set of weights;
``kl_reference=False`` switches it off.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from rlsched.cluster.errors import InvariantViolation, LiveBackendError
from rlsched.real.model.convert import LlamaShape, hf_to_megatron, load_hf_weights, megatron_to_hf
from rlsched.real.train.dp_group import DataParallelGroup, open_store
from rlsched.real.train.grpo import Sample
from rlsched.real.train.megatron_cpu import apply_cpu_workarounds, init_single_process_megatron
from rlsched.real.train.megatron_model import build_gpt_model, gpt_logits, read_hf_config
from rlsched.real.train.pg_loss import (
    BEHAVIOUR_CAP,
    CLIP_EPS,
    collate,
    collate_behaviour,
    off_policy_loss_sum,
    token_logprobs,
)
from rlsched.real.train.prefix_tree import charged_tokens, group_order, tree_logits

CHECKPOINT_FORMAT = "rlsched-trainer-v1"


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One fp32 buffer (on the first tensor's device) holding all of ``tensors``."""
    device = tensors[0].device
    return torch.cat([t.reshape(-1).to(device=device, dtype=torch.float32) for t in tensors])


def _unflat_(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t).to(device=t.device, dtype=t.dtype))
        offset += n


class TrainWorker:
    """A trainer rank. Methods are called by :class:`rlsched.real.train.trainer.TrainerGroup`."""

    def __init__(
        self,
        model_dir: str,
        *,
        seed: int,
        lr: float,
        weight_decay: float = 0.0,
        max_grad_norm: float | None = 1.0,
        threads: int = 1,
        max_tokens_per_forward: int = 8192,
        host: str = "127.0.0.1",
        clip_eps: float = CLIP_EPS,
        behaviour_cap: float = BEHAVIOUR_CAP,
        kl_reference: bool = True,
        processor: bool = False,
    ) -> None:
        torch.set_num_threads(threads)
        self.cpu_workarounds = apply_cpu_workarounds()
        init_single_process_megatron()
        torch.manual_seed(seed)
        self.config = read_hf_config(model_dir)
        self.shape = LlamaShape.from_hf_config(self.config)
        # On a GPU host the model moves to this process's visible GPU (Ray sets it) and the
        # CPU workarounds above are inactive; the gloo group then carries CUDA tensors.
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = build_gpt_model(self.config).to(self.device)
        self.names = [name for name, _ in self.model.named_parameters()]
        self.params = [p for _, p in self.model.named_parameters()]
        start_state = hf_to_megatron(load_hf_weights(model_dir), self.shape)
        self._set_megatron_weights(start_state)
        self.reference: torch.nn.Module | None = None
        if kl_reference:
            with torch.random.fork_rng(devices=[]):  # building it must not shift the training RNG
                self.reference = build_gpt_model(self.config).to(self.device)
            with torch.no_grad():
                for name, p in self.reference.named_parameters():
                    p.copy_(start_state[name])
                    p.requires_grad_(False)
            self.reference.eval()
        del start_state
        self.max_grad_norm = max_grad_norm
        self.max_tokens_per_forward = max_tokens_per_forward
        self.clip_eps, self.behaviour_cap = clip_eps, behaviour_cap
        self.processor = processor  # pack each group as a prefix tree (prefix_tree.py)
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay, foreach=False)
        for p in self.params:  # materialise AdamW state now so every rank has the same tensors
            self.optimizer.state[p] = {
                "step": torch.tensor(0.0),
                "exp_avg": torch.zeros_like(p),
                "exp_avg_sq": torch.zeros_like(p),
            }
        self.version = 0
        self.pending_tokens = 0
        self.host = host
        self._store = None
        self.group = DataParallelGroup(0, 1, host, 0, local_host=host)

    # -- weights ------------------------------------------------------------------------

    def _set_megatron_weights(self, state: dict[str, torch.Tensor]) -> None:
        if set(state) != set(self.names):
            missing, extra = set(self.names) - set(state), set(state) - set(self.names)
            raise LiveBackendError(f"weights do not fit the model: missing {sorted(missing)}, unexpected {sorted(extra)}")
        with torch.no_grad():
            for name, p in zip(self.names, self.params, strict=True):
                if tuple(state[name].shape) != tuple(p.shape):
                    raise LiveBackendError(f"weight {name}: shape {tuple(state[name].shape)}, model has {tuple(p.shape)}")
                p.copy_(state[name])

    def megatron_state(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in zip(self.names, self.params, strict=True)}

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        return megatron_to_hf(self.megatron_state(), self.shape)

    def _optimizer_tensors(self) -> list[torch.Tensor]:
        tensors = []
        for p in self.params:
            state = self.optimizer.state[p]
            tensors += [state["step"], state["exp_avg"], state["exp_avg_sq"]]
        return tensors

    def _grads(self) -> list[torch.Tensor]:
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        return [p.grad for p in self.params]  # type: ignore[misc]

    def digest(self) -> str:
        """A hash of weights, optimizer state and version: equal digests = identical ranks."""
        h = hashlib.sha256(str(self.version).encode())
        for t in [*self.params, *self._optimizer_tensors()]:
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()

    # -- the data-parallel group --------------------------------------------------------

    def node_host(self) -> str:
        return self.host

    def open_store(self, world: int) -> int:
        """Rank 0 of the next group generation hosts its rendezvous store; returns the port."""
        self._store = open_store(self.host, world)
        return self._store.port

    def fold_pending(self, keep: bool) -> int:
        """Sum pending gradients and token counts over the current group into this rank
        (``keep``) or drop them here (the new rank 0 keeps the sum); returns the token sum."""
        flat = self.group.all_reduce_sum_(_flat(self._grads()))
        count = torch.tensor([float(self.pending_tokens)], dtype=torch.float64, device=flat.device)
        tokens = int(self.group.all_reduce_sum_(count).item())
        if keep:
            _unflat_(flat, self._grads())
            self.pending_tokens = tokens
        else:
            self.optimizer.zero_grad(set_to_none=True)
            self.pending_tokens = 0
        return tokens

    def join(self, rank: int, world: int, master_host: str, port: int) -> None:
        """Leave the old group and rendezvous the new one (all ranks call this concurrently)."""
        self.group.close()
        store, self._store = (self._store, None) if rank == 0 else (None, None)
        self.group = DataParallelGroup(rank, world, master_host, port, local_host=self.host, master_store=store)

    def sync_from_rank0(self) -> None:
        """Broadcast weights, optimizer state and version from rank 0 to every rank."""
        tensors = [p.data for p in self.params] + self._optimizer_tensors()
        flat = self.group.broadcast_(_flat(tensors))
        _unflat_(flat, tensors)  # step counters stay on CPU, weights on the model's device
        version = self.group.broadcast_(torch.tensor([self.version], dtype=torch.int64, device=flat.device))
        self.version = int(version.item())

    # -- training -----------------------------------------------------------------------

    def _check(self, samples: Sequence[Sample]) -> None:
        for i, s in enumerate(samples):
            if not s.token_ids or len(s.token_ids) != len(s.loss_mask):
                raise InvariantViolation(f"trainer: sample {i} has {len(s.token_ids)} tokens, {len(s.loss_mask)} mask entries")
            if len(s.token_ids) > self.shape.max_positions:
                raise InvariantViolation(
                    f"trainer: sample {i} has {len(s.token_ids)} tokens, over the model's {self.shape.max_positions}"
                )
            if min(s.token_ids) < 0 or max(s.token_ids) >= self.shape.vocab:
                raise InvariantViolation(f"trainer: sample {i} has a token id outside [0, {self.shape.vocab})")

    def _chunks(self, samples: Sequence[Sample]) -> list[list[Sample]]:
        """Split a rank's share so that one forward pass holds at most
        ``max_tokens_per_forward`` padded tokens (bounds activation memory). With the
        processor, one chunk per group: its prefix tree is one packed forward pass, whatever
        its length (sharing is only within a pass)."""
        if self.processor:
            return [[samples[i] for i in members]
                    for members in group_order([s.group for s in samples]).values()]
        chunks: list[list[Sample]] = []
        current: list[Sample] = []
        for s in sorted(samples, key=lambda s: len(s.token_ids), reverse=True):
            longest = max([len(s.token_ids)] + [len(c.token_ids) for c in current])
            if current and longest * (len(current) + 1) > self.max_tokens_per_forward:
                chunks.append(current)
                current = []
            current.append(s)
        if current:
            chunks.append(current)
        return chunks

    def forward_backward(self, samples: Sequence[Sample]) -> dict:
        """Accumulate the gradient of the summed policy-gradient loss over ``samples``."""
        start = time.perf_counter()
        self._check(samples)
        self.model.train()
        loss_total, trained, padded = 0.0, 0, 0
        totals: dict[str, float] = {}
        for chunk in self._chunks(samples):
            loss, n, stats, numel = self._loss(chunk)
            loss.backward()
            loss_total += float(loss.item())
            trained += n
            padded += numel
            for k, v in stats.items():
                if k in ("max_staleness", "ratio_max"):
                    totals[k] = max(totals.get(k, v), v)
                elif k == "ratio_min":
                    totals[k] = min(totals.get(k, v), v)
                else:
                    totals[k] = totals.get(k, 0.0) + v
        self.pending_tokens += trained
        return {
            "loss_sum": loss_total,
            "trained_tokens": trained,
            "tokens": sum(len(s.token_ids) for s in samples),
            # the tokens the linear layers ran on: the packed trees' nodes with the processor
            "forward_tokens": (sum(charged_tokens([s.token_ids for s in samples], [s.group for s in samples]))
                               if self.processor else sum(len(s.token_ids) for s in samples)),
            "padded_tokens": padded,
            "seconds": time.perf_counter() - start,
            **totals,
        }

    def _loss(self, chunk: Sequence[Sample]) -> tuple[torch.Tensor, int, dict[str, float], int]:
        """The off-policy-corrected loss sum of one forward pass (``pg_loss.py``)."""
        tokens, mask, advantages = (t.to(self.device) for t in collate(chunk))
        off = collate_behaviour(chunk).to(self.device)
        reference = None
        if self.reference is not None:
            with torch.no_grad():
                reference = token_logprobs(self._logits(self.reference, chunk, tokens), tokens)
        loss, n, stats = off_policy_loss_sum(self._logits(self.model, chunk, tokens), tokens, mask, advantages,
                                             off, reference_logprobs=reference,
                                             clip_eps=self.clip_eps, behaviour_cap=self.behaviour_cap)
        return loss, n, stats, tokens.numel()

    def _logits(self, model: torch.nn.Module, chunk: Sequence[Sample], tokens: torch.Tensor) -> torch.Tensor:
        """The batch's logits: one padded forward pass, or with the processor one packed
        prefix-tree pass per group (same numbers up to rounding; ``prefix_tree.py``)."""
        if not self.processor:
            return gpt_logits(model, tokens)
        return tree_logits(model, [s.token_ids for s in chunk], [s.group for s in chunk], tokens.shape[1])

    @torch.no_grad()
    def loss(self, samples: Sequence[Sample]) -> float:
        """The token-mean (off-policy-corrected) policy-gradient loss of ``samples`` under the
        current weights; for on-policy samples the plain ``-A log p`` mean."""
        self._check(samples)
        self.model.eval()
        total, trained = 0.0, 0
        for chunk in self._chunks(samples):
            loss, n, _, _ = self._loss(chunk)
            total += float(loss.item())
            trained += n
        return total / max(trained, 1)

    def optimizer_step(self) -> dict:
        """All-reduce gradients and token counts, normalise, clip, step AdamW."""
        start = time.perf_counter()
        grads = self._grads()
        flat = self.group.all_reduce_sum_(_flat(grads))
        count = torch.tensor([float(self.pending_tokens)], dtype=torch.float64, device=flat.device)
        total = int(self.group.all_reduce_sum_(count).item())
        if total == 0:
            raise InvariantViolation("trainer: optimizer_step with no trained tokens since the last step")
        _unflat_(flat / total, grads)
        if self.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        else:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.pending_tokens = 0
        self.version += 1
        return {
            "version": self.version,
            "grad_norm": float(norm),
            "trained_tokens": total,
            "seconds": time.perf_counter() - start,
        }

    # -- checkpoints --------------------------------------------------------------------

    def save(self, path: str) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        torch.save(
            {
                "format": CHECKPOINT_FORMAT,
                "version": self.version,
                "hf_config": self.config,
                "megatron": self.megatron_state(),
                "optimizer": self.optimizer.state_dict(),
            },
            target,
        )

    def load(self, path: str) -> int:
        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError) as err:
            raise LiveBackendError(f"{path}: cannot read trainer checkpoint ({err})") from None
        if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
            raise LiveBackendError(f"{path}: not an {CHECKPOINT_FORMAT} trainer checkpoint")
        self._set_megatron_weights(data["megatron"])
        self.optimizer.load_state_dict(data["optimizer"])
        self.optimizer.zero_grad(set_to_none=True)
        self.pending_tokens = 0
        self.version = int(data["version"])
        return self.version
