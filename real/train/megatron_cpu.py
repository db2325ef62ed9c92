"""The few things megatron-core 0.16 needs to train a ``GPTModel`` on a CPU-only host.

Megatron-core is written for CUDA hosts; its *local* (non-transformer-engine) layers run on
CPU except for three places on the training path, patched here and nowhere else:

1. ``RotaryEmbedding.get_emb`` moves its inverse frequencies to
   ``torch.cuda.current_device()`` on the first forward pass, which raises on a CPU build
   of torch. The replacement is the same computation without that move.
2. ``DotProductAttention`` wraps attention dropout in ``get_cuda_rng_tracker().fork()``,
   which swaps CUDA RNG states. Megatron ships a no-op tracker (its inference tracker,
   whose ``fork`` is a null context); we install that one. This is exact, not an
   approximation, because our Llama configs have ``attention_dropout = 0``: no random
   numbers are drawn inside the fork.
3. ``DotProductAttention`` takes its attention-score scratch tensor from megatron's
   ``GlobalMemoryBuffer``, which allocates on ``torch.cuda.current_device()``. The score
   matmul uses it with ``beta=0`` (its contents are never read), so on CPU a fresh
   ``torch.empty`` of the requested shape is an exact replacement.

A fourth CUDA call, the causal mask built with ``device="cuda"`` when none is given, needs
no patch: the trainer always passes an explicit CPU mask, which is the documented input.

:func:`apply_cpu_workarounds` does nothing when ``torch.cuda.is_available()``: on GPU
hosts the unmodified megatron-core code runs.

:func:`init_single_process_megatron` gives megatron's ``parallel_state`` a world of one
process (tensor, pipeline and data parallel sizes 1). The trainer's data parallelism is
a separate gloo group it re-forms when its width changes (see ``dp_group.py``), so
megatron's global state never has to be torn down mid-run.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_applied = False


def _cpu_get_emb(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
    """``RotaryEmbedding.get_emb`` minus the move of ``inv_freq`` to a CUDA device."""
    freqs = self.get_freqs_non_repeated(max_seq_len, offset)
    if not self.rotary_interleaved:
        emb = torch.cat((freqs, freqs), dim=-1)
    else:
        emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1).view(freqs.shape[0], -1)
    return emb[:, None, None, :]


def _cpu_scratch(self, tensor_shape, dtype, name, mem_alloc_context=None) -> torch.Tensor:
    """``GlobalMemoryBuffer.get_tensor`` on CPU: an uninitialised tensor, as on GPU."""
    return torch.empty(tuple(tensor_shape), dtype=dtype)


def apply_cpu_workarounds() -> bool:
    """Install the CPU patches once per process; returns whether they are active."""
    global _applied
    if torch.cuda.is_available():
        return False
    if _applied:
        return True
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.tensor_parallel import random as mcore_random
    from megatron.core.utils import GlobalMemoryBuffer

    RotaryEmbedding.get_emb = _cpu_get_emb
    GlobalMemoryBuffer.get_tensor = _cpu_scratch
    mcore_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    _applied = True
    return True


def init_single_process_megatron() -> None:
    """A torch.distributed world of one (gloo) and megatron's model-parallel state on it."""
    from megatron.core import parallel_state

    if not dist.is_initialized():
        store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1, create_gloo_process_groups=False)
