"""Charging the trainer through the trajectory processor.

With the processor on, a micro-batch is packed as one prefix tree per group (task): each
shared prefix, duplicate or subsumed path is trained once (``rlsched.traces.processor``).
The trainer is charged the FLOPs of the tree's segments -- a segment of ``n`` tokens after
``offset`` earlier ones costs ``CostModel.train_flops(n, offset)`` -- and each trajectory
records the tokens charged to it. Sharing happens only *within* a micro-batch: activations
of a prefix trained in an earlier micro-batch are gone, so a policy that streams small
micro-batches saves less than one that trains a whole step at once. That difference is
real and is what this model shows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from rlsched.traces.processor import TrajTokens, process_group

from .cost import CostModel
from .workload import Workload

if TYPE_CHECKING:
    from .driver import SimTraj

Charge = Callable[[list[str], "dict[str, SimTraj]"], float]


def _suffix(run_id: str) -> str:
    _, sep, lap = run_id.rpartition("#")
    return f"#{lap}" if sep and lap.isdigit() else ""


def group_flops(
    workload: Workload,
    cost: CostModel,
    members: Iterable[tuple[str, int, int]],
) -> tuple[float, dict[str, int]]:
    """FLOPs and per-trajectory charged tokens for (run id, workload index, kept turns)."""
    by_task: dict[str, list[tuple[str, int, int]]] = {}
    for rid, i, kept in members:
        by_task.setdefault(workload.task_ids[i], []).append((rid, i, kept))
    flops = 0.0
    charged: dict[str, int] = {}
    for rows in by_task.values():
        present = {rid for rid, _, _ in rows}
        inputs = []
        for rid, i, kept in rows:
            # Every turn of the trace goes in, with ``finished_turns`` saying how many are
            # kept: the shared turns of a fork are its parent's *trace* turns, whether or not
            # the parent's replay got that far (an interrupted parent may keep fewer turns
            # than a fork that branched after them; its kept path is then a prefix of the
            # fork's and is merged into it).
            s, e = int(workload.start[i]), int(workload.start[i] + workload.turns[i])
            toks = (workload.prompt[s:e] + workload.output[s:e]).tolist()
            parent = workload.parent[i]
            parent_run = None if parent is None else parent + _suffix(rid)
            if parent_run not in present:
                parent_run = None
            branch = int(workload.branch_turn[i]) if parent_run is not None else None
            inputs.append(TrajTokens(rid, parent_run, branch, tuple(toks), finished_turns=kept))
        res = process_group(inputs)
        for node in res.nodes:
            flops += cost.train_flops(node.tokens, node.offset)
        for rid, _, _ in rows:
            charged[rid] = res.charged_tokens.get(rid, 0)
    return flops, charged


def processor_charge(workload: Workload, cost: CostModel) -> Charge:
    def charge(tids: list[str], trajs: dict[str, SimTraj]) -> float:
        members = [(t, trajs[t].widx, trajs[t].turns_done_kept) for t in tids]
        flops, charged = group_flops(workload, cost, members)
        for t, n in charged.items():
            trajs[t].charged = n
        return flops

    return charge
