"""The live driver's event loop: the policy's commands executed on real workers.

Same contract as the simulator, and the same code for its meaning: the driver loop
(``rlsched.cluster.loop``) delivers events one at a time, checks each command
(``legality.check``), records it and applies it before the next event, and keeps the
trainer queue and the step rows; this driver is its backend (``loop.backend``). Time is
wall-clock seconds since the run started.

Everything that blocks -- engine calls (Ray futures), environment calls and trainer
operations (worker threads), actor starts -- completes into one queue that the loop
drains in arrival order; the loop thread is the only one that touches the state, so
there are no locks. The work is split by side: ``loop.rollout`` (engines, turns, tools),
``loop.roles`` (role changes: draining engines, resizing the trainer), ``loop.training``
(trainer jobs on the lane, weight sync); this module is the event loop that ties them.

A resumed run (``checkpoint.py``) is, to this loop and to the policy, a fresh run of the
remaining steps: versions and steps count from 0, ``base`` is the checkpoint's version
(added on the way out: engines' weights, the record, progress) and the clock continues
from the checkpoint's time ``t_offset``. ``on_step`` is called once each optimizer step is
reported, before the policy reacts to it: that is when the run is made durable.

Tool calls take a sandbox slot, as in the simulator: at most ``sandbox_slots`` environment
steps run at once (and never more than ``[live] env_workers``, the threads that run them);
a call that finds every slot taken waits in FIFO order and is recorded as ``SandboxQueued``.
``faults`` (``loop.faults``, ``loop.fault_inject``) injects the ``[faults]`` schedule for
real: armed tool calls hang until they are cut, a weight sync fails, a GPU's engine is killed.
"""

from __future__ import annotations

import heapq
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from rlsched.cluster.errors import LiveBackendError, PolicyError, RlschedError
from rlsched.cluster.events import Event, RunStarted, TimerFired, ToolTimedOut, TrajectoryFinished
from rlsched.cluster.ids import TrajStatus
from rlsched.cluster.loop import DriverLoop
from rlsched.cluster.state import ClusterState
from rlsched.real.config import LiveSettings
from rlsched.real.envs.base import StepResult
from rlsched.real.loop.backend import LiveBackend
from rlsched.real.loop.fault_inject import fire_due
from rlsched.real.loop.faults import LiveFaults
from rlsched.real.loop.ray_cluster import SlotCluster
from rlsched.real.loop.roles import Roles
from rlsched.real.loop.rollout import Rollout
from rlsched.real.loop.training import Training
from rlsched.real.record.recorder import MemoryRecorder
from rlsched.real.record.tables import GpuTimeline
from rlsched.real.rollout.agent_loop import AgentTrajectory, Codec
from rlsched.real.rollout.engine import EngineSettings, engine_actor_class
from rlsched.real.train.lane import TrainerLane


class LiveDriver:
    def __init__(self, *, policy: Any, state: ClusterState, trajs: dict[str, AgentTrajectory],
                 settings: LiveSettings, engine_settings: EngineSettings, codec: Codec,
                 cluster: SlotCluster, lane: TrainerLane, recorder: MemoryRecorder,
                 make_env: Callable[[], Any], seed: int, progress: Callable | None = None,
                 base: int = 0, t_offset: float = 0.0, on_step: Callable[[], None] | None = None,
                 sandbox_slots: int | None = None, faults: LiveFaults | None = None) -> None:
        self.policy, self.st, self.trajs = policy, state, trajs
        self.settings, self.engine_settings, self.codec = settings, engine_settings, codec
        self.cluster, self.lane, self.rec = cluster, lane, recorder
        self.make_env, self.seed, self.progress = make_env, seed, progress
        self.base, self.t_offset, self.on_step = base, t_offset, on_step
        self.timeline = GpuTimeline(state.num_gpus, recorder, start=t_offset)
        self.rollout = Rollout(self)
        self.roles = Roles(self)
        self.training = Training(self)
        # the contract's meaning (pump, commands, trainer queue, records): rlsched.cluster.loop
        self.loop = DriverLoop(state, policy, LiveBackend(self), recorder, version_base=base,
                               progress=progress, step_recorded=on_step, guard_view=True)
        self.actor_cls = engine_actor_class()
        self._done_q: queue.Queue = queue.Queue()
        self._inflight = 0
        self._timers: list[tuple[float, int, str]] = []
        self._seq = 0
        self._env_pool = ThreadPoolExecutor(settings.env_workers, thread_name_prefix="rlsched-env")
        self.sandbox_slots = min(sandbox_slots or settings.env_workers, settings.env_workers)
        self._sandbox_busy = 0
        self._sandbox_wait: deque[tuple[str, int, Any, str]] = deque()  # (tid, epoch, env, text)
        self.sandbox_peak = 0  # most tool calls running at once
        self.sandbox_queued = 0  # tool calls that waited for a slot
        self.faults = faults
        self._stopping = threading.Event()  # ends a hung tool call's wait at shutdown
        self._misc_pool = ThreadPoolExecutor(8, thread_name_prefix="rlsched-live")
        self.stats: dict[str, list] = {"engine_start": [], "sync": [], "switch": [], "trainer": [], "micro_batch": [], "optimizer": []}
        self._completions = 0  # worker completions handled by the loop thread
        self.tokens_generated = 0
        self.engine_busy_seconds = 0.0
        self.engine_iterations = 0  # vLLM iterations, all engines
        self.engine_batched = 0  # requests per iteration, summed: / iterations = mean batch
        self.engine_submits = 0  # turns/aborts handed to a running step call
        self._t0 = time.monotonic()

    @property
    def steps(self) -> list[dict]:
        return self.loop.trainer.steps

    @property
    def events_processed(self) -> int:
        return self._completions + self.loop.pumped

    @property
    def trained_tokens(self) -> dict[str, int]:
        return self.training.trained_tokens

    # =============================================================== loop
    def now(self) -> float:
        return self.t_offset + time.monotonic() - self._t0

    def run(self) -> bool:
        """Run until the last optimizer step; False if stopped early (time limit, Ctrl-C)."""
        self._t0 = time.monotonic()
        self.loop.reset_policy(random.Random(self.seed))
        self.emit(RunStarted())
        self.loop.pump()
        deadline = self.t_offset + self.settings.max_wall_s  # per process: a resume gets its own
        try:
            while self.st.version < self.st.num_steps:
                if self.now() > deadline:
                    self.rec.event(self.now(), "Note", detail=f"stopped at max_wall_s={self.settings.max_wall_s:g}")
                    return False
                if not self._inflight and not self._timers and not self.loop.events:
                    raise PolicyError(
                        f"policy {self.policy.name} stalled at t={self.now():.1f}s: nothing is running "
                        f"and only {self.base + self.st.version} of {self.base + self.st.num_steps} steps are done"
                    )
                due = [t for t in (self._timers[0][0] if self._timers else None,
                                   self.faults.next_at() if self.faults else None) if t is not None]
                wait = max(0.0, min(1.0, min(due) - self.now())) if due else 1.0
                try:
                    cb, fut = self._done_q.get(timeout=wait)
                except queue.Empty:
                    cb = fut = None
                self.st.advance(self.now())
                self._fire_timers()
                if cb is not None:
                    self._inflight -= 1
                    self._completions += 1
                    cb(_result(fut))
                self.loop.pump()
        except KeyboardInterrupt:
            return False
        return True

    def _fire_timers(self) -> None:
        if self.faults is not None:
            fire_due(self)  # loop.fault_inject: what each fault does, for real
        while self._timers and self._timers[0][0] <= self.now():
            _, _, tag = heapq.heappop(self._timers)
            self.emit(TimerFired(tag))

    def submit(self, fut: Future, cb: Callable[[Any], None]) -> None:
        self._inflight += 1
        fut.add_done_callback(lambda f: self._done_q.put((cb, f)))

    def bg(self, fn: Callable[..., Any], *args: Any, cb: Callable[[Any], None], pool: str = "misc") -> None:
        ex = self._env_pool if pool == "env" else self._misc_pool
        self.submit(ex.submit(fn, *args), cb)

    def ray_call(self, ref: Any, cb: Callable[[Any], None], *, engine: int = -1) -> None:
        handle = self.rollout.engines.get(engine) if engine >= 0 else None

        def on_done(value: Any) -> None:
            if handle is not None and self.rollout.engines.get(engine) is not handle:
                return  # the engine died (a killed actor) since: its late replies are void
            if isinstance(value, _Failed):
                if engine < 0:
                    _raise(value.exc)
                self.roles.engine_failed(engine, value.exc)
                return
            cb(value)

        fut = ref.future()
        self._inflight += 1
        fut.add_done_callback(lambda f: self._done_q.put((on_done, _Catch(f))))

    def emit(self, ev: Event) -> None:
        self.loop.emit(ev)

    def set_timer(self, at: float, tag: str) -> None:
        """``SetTimer``: ``TimerFired(tag)`` once the clock passes ``at`` (see ``_fire_timers``)."""
        self._seq += 1
        heapq.heappush(self._timers, (at, self._seq, tag))

    def finish(self, tid: str, status: TrajStatus, e: int, note: str = "") -> None:
        self.st.mark_finished(tid, status)
        if note:
            self.rec.event(self.now(), "Note", trajectory=tid, engine=e, detail=note)
        self.emit(TrajectoryFinished(tid, status, e))

    # -------------------------------------------------------- environments
    def env_call(self, tid: str, epoch: int, kind: str, text: str = "") -> None:
        rt, t = self.rollout.rt[tid], self.trajs[tid]
        if rt.env is None:
            rt.env = self.make_env()
        env = rt.env
        if kind == "reset":
            self.bg(lambda: env.reset(t.task_id, seed=t.seed),
                    cb=lambda r: self.rollout.on_env(tid, epoch, kind, r), pool="env")
        elif self._sandbox_busy < self.sandbox_slots:
            self._tool_call(tid, epoch, env, text)
        else:
            self._sandbox_wait.append((tid, epoch, env, text))
            self.sandbox_queued += 1
            self.rec.event(self.now(), "SandboxQueued", trajectory=tid)

    def _tool_call(self, tid: str, epoch: int, env: Any, text: str) -> None:
        """Run one tool call in a sandbox slot; the slot is freed when it returns. A call an
        armed tool fault hits hangs for real: it holds its slot (and its trajectory waits)
        until the cut, and its result is the timeout (``ToolTimedOut``)."""
        self._sandbox_busy += 1
        self.sandbox_peak = max(self.sandbox_peak, self._sandbox_busy)
        limit = self.faults.take_hang(tid) if self.faults is not None else None
        if limit is not None:
            self.rec.event(self.now(), "Fault", trajectory=tid, detail=f"tool: call hangs, cut at {limit:g}s")

        def call() -> Any:
            t0 = time.monotonic()
            r = env.step(text)
            if limit is not None:
                self._stopping.wait(max(0.0, limit - (time.monotonic() - t0)))
            return r

        def done(r: Any) -> None:
            self._sandbox_busy -= 1
            self._next_tool_call()
            if limit is not None and self.faults is not None:
                cut = self.faults.cut(float(r.seconds))
                r = StepResult(observation=f"[the tool call timed out after {cut:g}s]", done=False,
                               reward=0.0, seconds=cut)
                if self.rollout.rt[tid].epoch == epoch:
                    self.emit(ToolTimedOut(tid, cut))
            self.rollout.on_env(tid, epoch, "step", r)

        self.bg(call, cb=done, pool="env")

    def _next_tool_call(self) -> None:
        while self._sandbox_wait and self._sandbox_busy < self.sandbox_slots:
            tid, epoch, env, text = self._sandbox_wait.popleft()
            rt = self.rollout.rt[tid]
            if rt.epoch != epoch or rt.env is not env:
                continue  # interrupted (or restarted) while it waited: the call is void
            self._tool_call(tid, epoch, env, text)

    def close_env(self, env: Any) -> None:
        self._env_pool.submit(env.close)

    def close_env_later(self, env: Any) -> None:
        self.close_env(env)  # queued behind its running call on the same pool

    def maybe_close_engine(self, e: int) -> None:
        self.roles.maybe_close_engine(e)

    def close_traj_env(self, tid: str) -> None:
        rt = self.rollout.rt[tid]
        if rt.env is not None and not rt.in_env:
            self.close_env(rt.env)
            rt.env = None

    # ============================================================= teardown
    def shutdown(self) -> None:
        import ray

        self._stopping.set()
        for eng in list(self.rollout.engines.values()):
            ray.kill(eng.actor)
        self.rollout.engines.clear()
        self.lane.shutdown()
        for rt in self.rollout.rt.values():
            if rt.env is not None:
                self._env_pool.submit(rt.env.close)
        self._env_pool.shutdown(wait=True, cancel_futures=True)
        self._misc_pool.shutdown(wait=False, cancel_futures=True)


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Catch:
    """A future whose exception becomes a value, so engine failures reach the loop."""

    def __init__(self, fut: Future) -> None:
        self.fut = fut

    def result(self) -> Any:
        try:
            return self.fut.result()
        except Exception as exc:
            return _Failed(exc)


def _result(fut: Any) -> Any:
    try:
        return fut.result()
    except RlschedError:
        raise
    except Exception as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, RlschedError):
            raise type(cause)(str(cause).splitlines()[0]) from None
        raise


def _raise(exc: BaseException) -> None:
    cause = getattr(exc, "cause", None)
    if isinstance(cause, RlschedError):
        raise type(cause)(str(cause).splitlines()[0]) from None
    raise LiveBackendError(f"live backend: a worker failed: {str(exc).strip().splitlines()[0][:200]}") from exc

