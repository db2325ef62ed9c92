"""Long-tailed synthetic agent rollouts (see :class:`~rlsched.traces.presets.GenParams`).

Everything is drawn with whole-array numpy operations from one ``np.random.Generator``
seeded by ``seed``: per trajectory (lengths, forks), then per row (tokens, time). The only
Python loop runs over the sample index within a group (a handful of iterations), because a
fork copies rows from an earlier sample that may itself be a fork. The seed-scale preset
(millions of rows) generates in seconds.

The draw order is part of the output: changing it changes every trace generated from a
seed, including the shipped sample, so the test that regenerates the sample will notice.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlsched.cluster.errors import ConfigError
from rlsched.traces.presets import GenParamError, GenParams, get_preset


def _lognormal(rng: np.random.Generator, median: float, sigma: float, size: int) -> np.ndarray:
    return median * np.exp(sigma * rng.standard_normal(size))


#: The schema's bound on a token count; a larger float does not even cast to int64.
_MAX_TOKENS = float(2**62)


def check_seed(where: str, seed: object) -> None:
    """A generator seed is a whole number >= 0 (numpy's generators take no other: a bare
    ValueError or TypeError from deep inside otherwise)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"{where}: seed={seed!r} — expected a whole number >= 0")


def _tokens(values: np.ndarray, scale: float, cap: float | None = None) -> np.ndarray:
    out = np.rint(values * scale)
    if cap is not None:
        out = np.minimum(out, np.rint(cap * scale))
    if out.size and float(out.max()) >= _MAX_TOKENS:
        raise GenParamError("tokens_scale", scale, f"token counts would reach {float(out.max()):.3g}: "
                            "expected a scale that keeps them below 2**62")
    return np.maximum(out, 1).astype(np.int64)


def _draw_turns(rng: np.random.Generator, p: GenParams, n_traj: int,
                task_of: np.ndarray, n_tasks: int) -> np.ndarray:
    """Drawn (uncapped) turn counts per trajectory, as floats."""
    task_factor = np.exp(p.task_sigma * rng.standard_normal(n_tasks))
    body = _lognormal(rng, p.turns_median, p.turns_sigma, n_traj)
    tail = _lognormal(rng, p.long_turns_median, p.long_turns_sigma, n_traj)
    is_long = rng.random(n_traj) < p.long_frac
    turns = np.where(is_long, tail, body) * task_factor[task_of] * p.turns_scale
    if p.growth != 1.0 and n_tasks > 1:
        # Episodes grow over the run: steps draw tasks in file order, so task k's lengths
        # are scaled by a factor rising linearly from 1 (first task) to ``growth`` (last).
        turns = turns * (1.0 + (p.growth - 1.0) * task_of / (n_tasks - 1))
    return turns


def _starts(lengths: np.ndarray) -> np.ndarray:
    start = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=start[1:])
    return start


def generate_trace(preset: str | GenParams, *, seed: int, **overrides: float) -> pd.DataFrame:
    """A synthetic trace in canonical form (same dtypes and order as ``load_trace``).

    ``preset`` is a name from ``PRESETS`` or a ``GenParams``; ``overrides`` replace fields
    (e.g. ``tasks=128``, ``tokens_scale=0.5``). Same preset, overrides and seed give the same
    rows on every machine. Columns: the required ones plus ``parent_trajectory_id``,
    ``branch_turn``, ``reward``, ``truncated``. Task ids are ``t<k>``, trajectory ids
    ``t<k>-s<j>`` (sample ``j`` of task ``k``); a fork always follows its parent in the file.
    """
    check_seed("generate_trace", seed)
    p = get_preset(preset)
    if overrides:
        p = p.replace(**overrides)
    rng = np.random.default_rng(seed)
    n_tasks, n_samples = p.tasks, p.samples
    n_traj = n_tasks * n_samples
    task_of = np.repeat(np.arange(n_tasks), n_samples)
    sample_of = np.tile(np.arange(n_samples), n_tasks)

    drawn = _draw_turns(rng, p, n_traj, task_of, n_tasks)
    drawn = np.maximum(np.rint(drawn), 1)
    hit_turn_limit = drawn > p.max_turns
    lengths = np.minimum(drawn, p.max_turns).astype(np.int64)

    # Forks: sample j > 0 of a group may branch from an earlier sample of the same group.
    parent = np.full(n_traj, -1, dtype=np.int64)
    branch = np.zeros(n_traj, dtype=np.int64)
    fork_roll = rng.random(n_traj)
    parent_pick = rng.random(n_traj)
    branch_pick = rng.random(n_traj)
    for j in range(1, n_samples):
        idx = np.flatnonzero(sample_of == j)
        par = idx - j + np.floor(parent_pick[idx] * j).astype(np.int64)
        ok = (fork_roll[idx] < p.branch_frac) & (lengths[par] >= 2)
        idx, par = idx[ok], par[ok]
        b = 1 + np.floor(branch_pick[idx] * (lengths[par] - 1)).astype(np.int64)
        parent[idx] = par
        branch[idx] = b
        grow = lengths[idx] <= b  # a fork continues past its branch point
        lengths[idx] = np.where(grow, b + 1, lengths[idx])
        hit_turn_limit[idx] &= ~grow
        over = lengths[idx] > p.max_turns
        lengths[idx] = np.minimum(lengths[idx], p.max_turns)
        hit_turn_limit[idx] |= over
        branch[idx] = np.minimum(branch[idx], lengths[idx])

    # Per-row draws.
    start = _starts(lengths)
    n_rows = int(start[-1])
    traj_of_row = np.repeat(np.arange(n_traj), lengths)
    turn = np.arange(n_rows, dtype=np.int64) - start[traj_of_row]
    task_prompt = _tokens(_lognormal(rng, p.prompt_tokens_median, p.prompt_tokens_sigma,
                                     n_tasks), p.tokens_scale)
    tool = _lognormal(rng, p.tool_tokens_median, p.tool_tokens_sigma, n_rows)
    tail = p.tool_tail_min * (1.0 - rng.random(n_rows)) ** (-1.0 / p.tool_tail_alpha)
    tool = np.where(rng.random(n_rows) < p.tool_tail_frac, tail, tool)
    prompt = _tokens(tool, p.tokens_scale, p.tool_tokens_cap)
    prompt[turn == 0] = task_prompt[task_of[traj_of_row[turn == 0]]]
    output = _tokens(_lognormal(rng, p.output_tokens_median, p.output_tokens_sigma, n_rows),
                     p.tokens_scale, p.output_tokens_cap)
    env = _lognormal(rng, p.env_seconds_median, p.env_seconds_sigma, n_rows)
    slow = _lognormal(rng, p.env_slow_median, p.env_slow_sigma, n_rows)
    env = np.where(rng.random(n_rows) < p.env_slow_frac, slow, env)
    env = np.round(np.minimum(env, p.env_seconds_cap), 3)

    # Shared turns of a fork are its parent's rows (parents are final before children).
    for j in range(1, n_samples):
        kids = np.flatnonzero((sample_of == j) & (parent >= 0))
        if kids.size == 0:
            continue
        rows = np.repeat(start[kids], branch[kids])
        offs = np.arange(rows.size) - np.repeat(_starts(branch[kids])[:-1], branch[kids])
        src = np.repeat(start[parent[kids]], branch[kids]) + offs
        dst = rows + offs
        prompt[dst], output[dst], env[dst] = prompt[src], output[src], env[src]

    # Limits: stop before the first turn whose context or summed env time is over budget.
    ctx = np.cumsum(prompt + output)
    ctx -= np.repeat(ctx[start[:-1]] - (prompt + output)[start[:-1]], lengths)
    clock = np.cumsum(env)
    clock -= np.repeat(clock[start[:-1]] - env[start[:-1]], lengths)
    over = (ctx > p.max_context_tokens) | (clock > p.max_env_seconds)
    over_turn = np.where(over, turn, np.iinfo(np.int64).max)
    first_over = np.minimum.reduceat(over_turn, start[:-1])
    cut = np.clip(first_over, 1, lengths)  # keep at least the first turn
    truncated = hit_turn_limit | (cut < lengths)
    keep = turn < cut[traj_of_row]
    for j in range(1, n_samples):  # a shortened parent shortens its forks' shared part
        kids = np.flatnonzero((sample_of == j) & (parent >= 0))
        branch[kids] = np.minimum(branch[kids], np.minimum(cut[kids], cut[parent[kids]]))

    # Rewards: per-task success probability, 0 for truncated trajectories.
    a = p.success_rate * p.success_concentration
    b_ = (1.0 - p.success_rate) * p.success_concentration
    p_task = rng.beta(max(a, 1e-9), max(b_, 1e-9), n_tasks)
    reward = ((rng.random(n_traj) < p_task[task_of]) & ~truncated).astype(np.float64)

    width = max(4, len(str(n_tasks - 1)))
    sw = max(2, len(str(n_samples - 1)))
    task_names = np.array([f"t{k:0{width}d}" for k in range(n_tasks)], dtype=object)
    traj_names = np.array([f"t{k:0{width}d}-s{j:0{sw}d}"
                           for k in range(n_tasks) for j in range(n_samples)], dtype=object)
    parent_names = np.where(parent >= 0, traj_names[np.maximum(parent, 0)], None)

    rows = traj_of_row[keep]
    has_parent = parent[rows] >= 0
    df = pd.DataFrame({
        "task_id": pd.Series(task_names[task_of[rows]], dtype=object),
        "trajectory_id": pd.Series(traj_names[rows], dtype=object),
        "turn": turn[keep],
        "prompt_tokens": prompt[keep],
        "output_tokens": output[keep],
        "env_seconds": env[keep],
        "parent_trajectory_id": pd.Series(parent_names[rows], dtype=object),
        "branch_turn": pd.arrays.IntegerArray(branch[rows], ~has_parent),
        "reward": reward[rows],
        "truncated": truncated[rows],
    })
    return df
