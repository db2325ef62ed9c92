"""Simulator-side state of one trajectory.

A plain class with ``__slots__`` so that the same source runs as Python and, when the
package is built with Cython, as an extension type whose fields are C members
(``traj.pxd``): the per-turn code in :mod:`.turns` then reads and writes them without
attribute lookups. Keep the field list here and in ``traj.pxd`` in step.

Its per-turn data (prompt and output tokens, tool seconds) stays in the workload's arrays:
turn ``i`` is row ``first + i`` of the driver's ``w_prompt``/``w_output``/``w_env`` views
(C arrays when compiled), so no Python object is made per turn, not even per dispatch.
"""

from __future__ import annotations

from typing import Any


class SimTraj:
    """Simulator-side state of one trajectory (its turn data only while in flight).

    Identity-hashed: engines key their batch and KV tables by these objects, so the hot
    path never looks a trajectory up by id. It is also the SimPy event of its own
    tool-call timer (``callbacks``/``ok``, like :class:`~rlsched.sim.timers.Call`)
    whenever no such timer of it is pending, which saves allocating one object per
    simulated turn.
    """

    ok = True  # (SimPy event protocol: it never fails)

    __slots__ = (
        "callbacks", "charged", "ctx", "env_token", "fault_hits", "first", "generated", "hung",
        "in_env", "join_token", "kv_cached", "mid_turn", "moved_at", "moved_from", "n_turns", "output_kept",
        "pending_out", "prefill_end", "prompt_kept", "sandbox", "tid", "timer_token", "truncated", "ts",
        "turn_progress", "turn_version", "waiting_sandbox", "wasted", "widx",
    )

    def __init__(self, tid: str, widx: int, first: int, n_turns: int, truncated: bool,
                 ts: Any = None) -> None:
        self.tid = tid
        self.widx = widx  # index in the workload
        self.first = first  # its first turn's row in the workload's per-turn arrays
        self.n_turns = n_turns
        self.truncated = truncated
        self.ts = ts  # its ClusterState.TrajState (status, engine, turns_done)
        self.ctx = 0  # tokens of finished, kept turns
        self.charged = -1  # tokens the trainer was charged for (-1: its whole context)
        self.prompt_kept = 0
        self.output_kept = 0
        self.generated = 0  # every output token ever produced (kept + wasted)
        self.wasted = 0
        self.mid_turn = False  # current turn's prompt is in the context
        self.turn_progress = 0  # tokens of the current turn produced and kept
        self.pending_out = 0  # tokens of an admitted turn counted in its engine's unborn
        # the oldest weights that generated a kept token of the current turn (a turn moved
        # mid-way keeps its first engine's version when that is older: staleness counts it)
        self.turn_version = -1
        self.kv_cached = False
        self.moved_at = -1.0  # KV can be pulled from the engine it left at this time
        self.moved_from = -1  # first GPU of that engine (where the KV is pulled from)
        # when the current turn's prompt is prefilled (inf: it has not joined a decode batch
        # yet); a move before then leaves the prompt behind, to be prefilled where it lands
        self.prefill_end = 0.0
        self.env_token = 0  # bumps cancel a pending tool-call completion
        self.join_token = 0  # bumps cancel a pending join after a KV transfer
        self.in_env = False
        self.sandbox = False
        self.waiting_sandbox = False
        self.callbacks: tuple | None = None  # set while it is pending as its own timer event
        self.timer_token = 0  # env_token of that pending timer
        self.hung = 0.0  # its pending tool call hung and is cut after this many seconds
        self.fault_hits = 0  # times a fault stopped it (each time it was dispatched again)

    @property
    def turns_done_kept(self) -> int:
        """Finished, kept turns (its ``TrajState.turns_done``)."""
        return self.ts.turns_done

    def __repr__(self) -> str:
        return (f"SimTraj({self.tid!r}, turns {self.ts.turns_done if self.ts else '?'}/"
                f"{self.n_turns}, ctx={self.ctx}, in_env={self.in_env})")
