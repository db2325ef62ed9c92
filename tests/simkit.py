"""Helpers for simulator tests: tiny traces and a cost model whose timeline is easy to
compute by hand (decode step = 1 s whatever the batch, everything else ~free)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from rlsched.cluster.config import RunConfig
from rlsched.policies import make_policy
from rlsched.sim.cost import CostModel
from rlsched.sim.run import SimOutcome, simulate
from rlsched.sim.workload import Workload

# 1e9 weight bytes read at 1e9 B/s per decode step -> exactly 1 s per step (tp=1);
# compute so fast that prefill, training and the batch term are ~1e-9 s; KV negligible.
HAND_COST = CostModel(
    params=0.5e9, layers=1, d_model=1, kv_heads=1, head_dim=1, bytes_per_param=2.0,
    kv_bytes_per_elem=1e-9, hbm_bytes=10e9, hbm_bw=1e9, peak_flops=1e21, gpu_mem_util=0.9,
    decode_bw_eff=1.0, decode_compute_eff=1.0, decode_overhead_s=0.0, prefill_eff=1.0,
    train_mfu=1.0, max_num_seqs=256, sync_bw=1e21, sync_latency_s=0.0, kv_transfer_bw=1e21,
    switch_s=1.0, optimizer_step_s=0.0,
)


def trace(rows: Sequence[tuple[str, str, int, int, int, float]]) -> pd.DataFrame:
    """rows: (task, trajectory, turn, prompt_tokens, output_tokens, env_seconds)."""
    return pd.DataFrame(
        rows, columns=["task_id", "trajectory_id", "turn", "prompt_tokens", "output_tokens", "env_seconds"]
    )


def run(
    df: pd.DataFrame,
    steps: Sequence[Sequence[str]],
    spec: str,
    *,
    gpus: int = 2,
    tp: int = 1,
    cost: CostModel = HAND_COST,
    out_dir=None,
    check: bool = True,
    **cfg,
) -> SimOutcome:
    w = Workload.from_frame(df)
    batches = [[(t, t) for t in s] for s in steps]
    config = RunConfig(gpus=gpus, tp=tp, steps=len(steps), check=check, **cfg)
    return simulate(w, batches, make_policy(spec), config, cost, out_dir=out_dir, spec=spec)


#: Tolerance of the hand-computed timelines.
APPROX = dict(rel=1e-6, abs=1e-6)

#: The hand-computed timelines' trace. A: 1 turn of 3 tokens; B: 1 token, 2 s of tool time,
#: 1 token; C: 1 turn of 2 tokens.
ABC = trace([
    ("t", "A", 0, 10, 3, 0.0),
    ("t", "B", 0, 10, 1, 2.0),
    ("t", "B", 1, 5, 1, 0.0),
    ("t", "C", 0, 10, 2, 0.0),
])


def synthetic(n_traj: int, turns: int, tokens: float = 1.0, steps: int = 2, seed: int = 0):
    """Plain workload and its batches: ``steps`` x ``n_traj`` trajectories of ``turns`` turns,
    Poisson prompts (~20 x ``tokens``) and outputs (~10 x ``tokens``), 1-10 s tools."""
    rng = np.random.default_rng(seed)
    n = n_traj * steps
    rows = n * turns
    ids = np.repeat(np.array([f"g{i:04d}" for i in range(n)], dtype=object), turns)
    df = pd.DataFrame({
        "task_id": ids, "trajectory_id": ids, "turn": np.tile(np.arange(turns), n),
        "prompt_tokens": np.maximum(1, rng.poisson(20 * tokens, rows)),
        "output_tokens": np.maximum(1, rng.poisson(10 * tokens, rows)),
        "env_seconds": rng.uniform(1.0, 10.0, rows),
    })
    w = Workload.from_frame(df)
    ids_u = w.trajectory_ids
    return w, [[(t, t) for t in ids_u[s * n_traj:(s + 1) * n_traj]] for s in range(steps)]


def sample_case(preset: str, seed: int, tasks: int, samples: int, tp: int, engines: int, steps: int,
                scale: float, cost: CostModel | None = None):
    """A case as ``bench/no_harm.py`` draws one (a ``preset`` trace of ``tasks`` x ``steps``
    tasks of ``samples``, turns scaled by ``scale``, on ``engines`` engines of ``tp``):
    ``seconds(spec)``, the makespan of a complete run of that policy spec on it (``cost``:
    the default preset's cost model unless given)."""
    from rlsched.sim.presets import default_cost
    from rlsched.traces import draw_batches, generate_trace

    df = generate_trace(preset, seed=seed, tasks=tasks * steps, samples=samples, turns_scale=scale)
    w, b = Workload.from_frame(df), draw_batches(df, steps, tasks)
    cfg = RunConfig(gpus=tp * engines, tp=tp, steps=steps)
    model = cost if cost is not None else default_cost()

    def seconds(spec: str) -> float:
        r = simulate(w, b, make_policy(spec), cfg, model).result
        assert r.complete, spec
        return r.makespan

    return seconds


class FakeScript:
    """A fake policy for tests: ``script(event, view)`` -> commands, nothing else (no state
    of its own), with the staleness bound and ``defers`` declaration the test gives it."""

    name = "fake-script"
    params = ()

    def __init__(self, script, *, staleness: int = 0, defers: bool = False) -> None:
        self.script = script
        self.max_staleness = staleness
        self.defers = defers

    def reset(self, view, rng) -> None:
        pass

    def on_event(self, event, view):
        return list(self.script(event, view))


def two_engines(batch: Sequence[tuple[str, str]], *, running: Sequence[str] = (),
                pending: Sequence[str] = (), max_staleness: int = 0, kv_capacity: int = 1000):
    """A hand-built cluster for driverless tests: two single-GPU engines rolling out step 0
    (``batch``: (trajectory, task) pairs), each trajectory but those ``pending`` dispatched
    to engine 0, pinned -- those in ``running`` admitted there, the rest waiting in its
    queue."""
    from rlsched.cluster.ids import Role
    from rlsched.cluster.state import ClusterState, EngineState

    st = ClusterState(2, 1, [list(batch)], max_staleness)
    st.advance(0.0)
    for g in (0, 1):
        st.roles[g] = Role.ROLLOUT
        st.add_engine(EngineState(g, (g,), 0, kv_capacity))
    for tid, _ in batch:
        if tid in pending:
            continue
        st.mark_dispatched(tid, 0)
        st.engines_[0].enqueue(tid)
        if tid in running:
            st.engines_[0].dequeue(admit=True)
            st.mark_running(tid, 0)
    return st
