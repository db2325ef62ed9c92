"""The simulator's inner loop: the two timers every simulated turn fires.

Per turn the driver processes an engine wake-up (the turn's decode ends,
:func:`wake_timer`, which ends the turns due via :func:`turn_done`) and a tool-call
return (:func:`env_timer`, which starts the next turn). Everything else a trajectory
does -- dispatch, admission, interrupts, migration, finishing -- is in :mod:`.lifecycle`
and is called from here only on its uncommon paths.

They are module functions of the rollout core (``d``, a
:class:`~rlsched.sim.lifecycle.Lifecycle`, whose typed fields are
:class:`~rlsched.sim.core.DriverCore`'s) rather than methods so that a Cython build can
compile them with typed locals (``turns.pxd``): with :class:`~rlsched.sim.traj.SimTraj` and
:class:`~rlsched.sim.engine.EngineSim` as extension types, the per-turn reads and
writes of trajectory and engine fields become C member accesses. Without a build the
same source runs as Python. The common paths are written out (the tool-call timer is
pushed inline as in ``Lifecycle._env_later``, the first turn's start inline as in
``Lifecycle._start_turn``), and the engine's GPU state is recomputed only when it can
have changed (a decoding engine, not syncing, whose GPUs already show GENERATE:
``Lifecycle._engine_touch`` would do nothing).
"""

from __future__ import annotations

from heapq import heappush
from typing import Any

from rlsched.cluster.events import EngineIdle
from rlsched.cluster.ids import GpuState, TrajStatus

from .engine import EngineSim
from .gpus import CODE
from .timers import NORMAL, Call
from .traj import SimTraj

_INF = float("inf")
_QUEUED = TrajStatus.QUEUED
_RUNNING = TrajStatus.RUNNING
_TIMED_OUT = TrajStatus.TIMED_OUT
_GENERATE = GpuState.GENERATE
_SYNC = GpuState.SYNC
_TOOL_WAIT = GpuState.TOOL_WAIT
_ROLLOUT_IDLE = GpuState.ROLLOUT_IDLE


def wake_timer(d: Any, ev: Any) -> None:
    """Timer callback: the engine's earliest decode may have ended; end those turns."""
    d.events_processed += 1
    now = d.now  # (set by DriverCore.run_until)
    if type(ev) is Call:
        eng: EngineSim = ev.a
        at = ev.b
    else:
        eng = ev
        at = eng.timer_at
    if not eng.closed:
        if at == eng.wake_at:
            eng.wake_at = _INF
        for t in eng.pop_due(now):
            turn_done(d, t, eng)
        if not eng.closed:
            if d.seq_wait and eng in d.seq_wait:  # (turns waiting for a max_num_seqs slot)
                d._resume_seq(eng)
            if eng.members and eng.overflowing(now):  # (generated tokens filled the KV)
                d._relieve(eng)
            eng.rearm(now)
            if not (eng.members and eng.gstate is _GENERATE and eng.sync_end <= now):
                engine_touch(d, eng)
    if d._events:
        d.pump()


def turn_done(d: Any, t: SimTraj, eng: EngineSim) -> None:
    """``t``'s turn on ``eng`` has generated its last token: keep it, start its tool call."""
    ts = t.ts
    i = ts.turns_done
    row = t.first + i
    p = d.w_prompt[row]
    o = d.w_output[row]
    t.generated += o - t.turn_progress
    t.ctx += p + o
    t.prompt_kept += p
    t.output_kept += o
    t.mid_turn = False
    t.turn_progress = 0
    ts.turns_done = i + 1
    ts.tokens = t.ctx
    t.pending_out = 0  # (its reservation, the whole turn, is now its context)
    v0 = t.turn_version
    if ts.min_version < 0 or v0 < ts.min_version:
        ts.min_version = v0
    if eng.version > ts.max_version:
        ts.max_version = eng.version
    delay = d.w_env[row]
    if i + 1 == t.n_turns and not delay > 0.0:
        d._done_on(t, eng)
        return
    # tool time (after the last turn too: a final call, e.g. the tests a submission
    # runs, is part of the trajectory), in a sandbox slot if one is free
    t.in_env = True
    t.env_token = token = t.env_token + 1
    if d.sandbox_free > 0:
        d.sandbox_free -= 1
        t.sandbox = True
        if d.faults.hangs:
            delay = d.faults.hang(t, delay)
        if t.callbacks is None:  # (Lifecycle._env_later, inline)
            t.callbacks = d._env_callbacks
            t.timer_token = token
            ev: object = t
        else:
            ev = Call(d._env_callbacks, None, t, token)
        heappush(d._queue, (d.now + (delay if delay > 0.0 else 0.0), NORMAL, next(d._eid), ev))
    else:
        t.waiting_sandbox = True
        d.sandbox_queue.append(t)
        if d.rec is not None:
            d.rec.event(d.now, "SandboxQueued", trajectory=t.tid)
    if eng.es.draining:
        d._move_out(t, eng)  # finish_turn drain: leave between turns
    else:
        eng.env_lru[t] = None


def env_timer(d: Any, ev: Any) -> None:
    """Timer callback: a tool call returned; start the next turn (or queue for KV)."""
    d.events_processed += 1
    now = d.now  # (set by DriverCore.run_until)
    if type(ev) is Call:
        t: SimTraj = ev.a
        token = ev.b
    else:
        t = ev
        token = t.timer_token
    if token != t.env_token:  # cancelled (interrupted or moved meanwhile)
        if d._events:
            d.pump()
        return
    if t.hung:
        d.faults.tool_cut(t)
    if t.waiting_sandbox or d.sandbox_queue:
        d._release_sandbox(t)
    elif t.sandbox:  # (Lifecycle._release_sandbox's common case, inline)
        t.sandbox = False
        d.sandbox_free += 1
    t.in_env = False
    ts = t.ts
    status = ts.status
    if status is _QUEUED:
        d._rejoin_after_tool(t)
    elif status is _RUNNING:  # (else interrupted meanwhile: it waits for a Dispatch)
        eng: EngineSim = d.engines[ts.engine]
        i = ts.turns_done
        if i == t.n_turns:  # its last tool call returned
            d._done_on(t, eng)
            if d._events:
                d.pump()
            return
        eng.env_lru.pop(t, None)
        row = t.first + i
        p = d.w_prompt[row]
        o = d.w_output[row]
        need = t.ctx + p + o
        if need > eng.kv_capacity:
            eng.es.discard(t.tid)
            eng.release(t)
            d._finish(t, _TIMED_OUT, eng.id, note="context exceeds KV capacity")
            d._admit(eng)
        elif not eng.reserve(t, need, o, now):
            d._wait_for_kv(t, eng)
        else:
            t.pending_out = o
            if eng.evicted:
                d._drain_evictions(eng)
            if t.kv_cached:  # (Lifecycle._start_turn's common case, inline: prefix cache hit)
                if t.mid_turn:
                    new, cached = 0, t.ctx + p
                else:
                    new, cached = p, t.ctx
                t.moved_at = -1.0
                t.mid_turn = True
                t.prefill_end = _INF  # (until it joins: Lifecycle._move)
                if t.turn_progress == 0 or eng.version < t.turn_version:
                    t.turn_version = eng.version
                if len(eng.members) < d.max_seqs:
                    t.prefill_end = eng.join(now, t, cached, new, o - t.turn_progress)
                    if eng.gstate is not _GENERATE or eng.sync_end > now:
                        engine_touch(d, eng)
                    eng.rearm(now)
                else:
                    d._wait_seq(t, eng, new, cached)
                    engine_touch(d, eng)
            elif not d._start_turn(t, eng):  # (a join already updated the GPU state)
                engine_touch(d, eng)
    if d._events:
        d.pump()


def engine_touch(d: Any, eng: EngineSim) -> None:
    """Recompute the engine's GPU state after a change; report an idle engine.

    (Here rather than in :mod:`.roles` because turns change it about twice each.)"""
    if eng.closed:
        return
    es = eng.es
    now = d.now
    if eng.sync_end > now:
        state = _SYNC
    elif eng.members or eng.stall_end > now:
        state = _GENERATE
    elif es.running:
        state = _TOOL_WAIT
    else:
        state = _ROLLOUT_IDLE
    prev = eng.gstate
    if state is not prev:
        if eng.owns:
            # the interval the engine's GPUs were in since gsince ends (step -1: see
            # GpuStates.claim, which hands the engine its GPUs' open interval)
            since = eng.gsince
            if now > since:
                code = eng.gcode
                d.gpu_busy[code] += (now - since) * eng.tp
                if d.iv_on:  # (RunRecorder.interval, inline: see interval_buffers)
                    i = d.iv_n[0]
                    d.iv_first[i] = eng.first_gpu
                    d.iv_count[i] = eng.tp
                    d.iv_start[i] = since
                    d.iv_end[i] = now
                    d.iv_state[i] = code
                    d.iv_step[i] = -1
                    d.iv_n[0] = i + 1
                    if i + 1 >= d.iv_cap:
                        d.rec.flush_full()
        else:  # first write (its GPUs may still differ): the general path, then own them
            d.gpus.set(range(eng.first_gpu, eng.first_gpu + eng.tp), state, now)
            d.gpus.claim(eng)
        eng.gstate = state
        eng.gcode = CODE[state]
        eng.gsince = now
    if es.draining:
        d.roles.maybe_close_engine(eng)
    elif state is _ROLLOUT_IDLE and prev is not _ROLLOUT_IDLE and not es.queue:
        d.emit(EngineIdle(eng.id))
