"""Which trajectories of a trace each RL step uses (DESIGN.md: "a trace is a pool of tasks").

Kept apart from loading so both drivers and the analysis draw steps the same way.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from rlsched.cluster.errors import ConfigError


class DrawnTrajectory(NamedTuple):
    """One trajectory of one step: the id it has in the run and the trace row it replays.

    ``run_id`` equals ``trace_id`` the first time a trace trajectory is drawn; when the pool
    cycles (more steps than tasks) its later uses get ``"<trace_id>#2"``, ``"#3"``, ... so
    run ids stay unique across the whole run. A suffix that is itself a trajectory id of the
    trace is skipped: the importers name a repeated instance ``x#2`` (``x``'s second use is
    then ``x#3``). It is a tuple: ``run, trace = drawn``.
    """

    run_id: str
    trace_id: str


#: Most task draws one run may ask for (steps x tasks per step): far above the reference
#: system's scale (48 x 512), low enough that a mistyped count fails at once instead of
#: building a list of billions of trajectories.
MAX_TASK_DRAWS = 10_000_000


def _check_count(name: str, value: int | None, *, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigError(f"{name}={value!r} — expected a whole number >= 1")


def check_draw(df: pd.DataFrame, tasks_per_step: int | None, samples_per_task: int | None,
               source: str) -> None:
    """Refuse batch settings the trace cannot honour, where the user's settings meet the
    user's trace (``rlsched compare``/``run``/``plan``, before :func:`draw_batches`):
    ``tasks_per_step`` above its tasks, ``samples_per_task`` above its largest group.
    ``df``: the trace, or its one-row-per-trajectory index; ``source``: its file."""
    _check_tasks_per_step(df, tasks_per_step, source)
    _check_samples_per_task(df, samples_per_task, source)


def _check_tasks_per_step(df: pd.DataFrame, tasks_per_step: int | None, source: str) -> None:
    """Refuse a ``tasks_per_step`` above the tasks of a trace without a ``step`` column
    (``df``: the trace, or its one-row-per-trajectory index; ``source``: its file, for the
    message), where the user's setting meets the user's trace (``rlsched compare``/``run``/
    ``plan``).

    Why: a step draws tasks from the pool, and more tasks than the pool holds replays the
    same recordings several times in one step -- 2 tasks at 1,000,000 a step drew 4,000,000
    copies of them, and the run simulated for minutes with its progress bar at step 0. More
    *steps* than the pool covers are fine (they wrap around to its first task), and
    :func:`draw_batches` itself still wraps inside a step for the callers that need it (the
    planner's trace variants may have fewer tasks than the trace they came from)."""
    if tasks_per_step is None or "step" in df.columns:
        return  # (default: a pass over the pool; with steps recorded: at most a step's tasks)
    tasks = int(df["task_id"].nunique())
    if isinstance(tasks_per_step, int | np.integer) and tasks_per_step > tasks:
        raise ConfigError(
            f"tasks_per_step={int(tasks_per_step):,}: the trace {source} has {tasks:,} "
            f"task{'s' if tasks != 1 else ''} and a step draws each at most once; expected at "
            f"most {tasks:,} (more steps than the trace covers wrap around to its first task)"
        )


def _check_samples_per_task(df: pd.DataFrame, samples_per_task: int | None, source: str) -> None:
    """Refuse a ``samples_per_task`` above the largest group of the trace (``df``: the
    trace, or its one-row-per-trajectory index; ``source``: its file), where the user's
    setting meets the user's trace, as :func:`_check_tasks_per_step` does.

    Why: the setting caps each task's trajectories; above every group of the trace it caps
    nothing, so ``--samples-per-task 8`` on a trace of 2 trajectories per task ran groups of
    2 while the config and ``meta.json`` said 8, without a word. A value between the
    smallest and the largest group is a cap that bites on some tasks: accepted."""
    if samples_per_task is None or df.empty:
        return
    largest = int(df.drop_duplicates("trajectory_id")["task_id"].value_counts().max())
    if isinstance(samples_per_task, int | np.integer) and samples_per_task > largest:
        raise ConfigError(
            f"samples_per_task={int(samples_per_task):,}: the trace {source} has at most "
            f"{largest:,} trajector{'ies' if largest != 1 else 'y'} per task and a step "
            f"replays each at most once; expected at most {largest:,} (or leave it out: "
            f"every trajectory of a task)"
        )


def _task_table(df: pd.DataFrame) -> tuple[list[str], dict[str, list[str]], dict[str, str]]:
    """Tasks in file order, each task's trajectories in file order, and child -> parent."""
    first = df.drop_duplicates("trajectory_id", keep="first")
    tasks: dict[str, list[str]] = {}
    for task, tid in zip(first["task_id"].tolist(), first["trajectory_id"].tolist(),
                         strict=True):
        tasks.setdefault(task, []).append(tid)
    parents: dict[str, str] = {}
    if "parent_trajectory_id" in first.columns:
        has = first["parent_trajectory_id"].notna()
        parents = dict(zip(first.loc[has, "trajectory_id"].tolist(),
                           first.loc[has, "parent_trajectory_id"].tolist(), strict=True))
    return list(tasks), tasks, parents


def _cap(trajs: list[str], samples: int | None, parents: dict[str, str]) -> list[str]:
    """The first ``samples`` trajectories, plus any ancestors they need (never orphan a fork)."""
    if samples is None or samples >= len(trajs):
        return trajs
    keep = set(trajs[:samples])
    available = set(trajs)
    for tid in trajs[:samples]:
        cur = parents.get(tid)
        while cur is not None and cur not in keep and cur in available:
            keep.add(cur)
            cur = parents.get(cur)
    return [t for t in trajs if t in keep]


def draw_batches(df: pd.DataFrame, num_steps: int, tasks_per_step: int | None = None,
                 samples_per_task: int | None = None) -> list[list[DrawnTrajectory]]:
    """The trajectories step ``s`` (0-based) replays, as ``(run_id, trace_id)`` pairs.

    ``df`` is a canonical trace (from ``load_trace``/``validate_trace``).

    Without a ``step`` column the trace is a pool of tasks in file order: step ``s`` takes
    tasks ``s*k .. s*k+k-1`` (``k = tasks_per_step``), wrapping around to the start of the
    pool when it runs out, and every trajectory of each task (the whole group, so a fork is
    always in its parent's step). ``tasks_per_step=None`` means ``max(1, tasks // num_steps)``,
    so by default one pass over the pool covers the run.

    With a ``step`` column, step ``s`` takes the rows of the ``s``-th distinct step value (in
    ascending order, wrapping around when ``num_steps`` exceeds them); ``tasks_per_step``, if
    given, keeps only the first that many tasks of that step.

    ``samples_per_task`` keeps the first that many trajectories of each task in file order
    (plus the ancestors any kept fork branches from); ``None`` keeps all.

    A trace trajectory drawn again (the pool wrapped) gets run id ``"<id>#<k>"`` for its
    k-th use, skipping a ``k`` whose run id is another trajectory's id in the trace (see
    :class:`DrawnTrajectory`). Raises :class:`ConfigError` for counts below 1.
    """
    _check_count("num_steps", num_steps, allow_none=False)
    _check_count("tasks_per_step", tasks_per_step, allow_none=True)
    _check_count("samples_per_task", samples_per_task, allow_none=True)
    if len(df) == 0:
        raise ConfigError("the trace has no rows — expected at least one task to draw")
    order, trajs_of, parents = _task_table(df)
    # every trace id is some trajectory's first run id: a later use must not take one
    # (an imported trace holds both ``x`` and ``x#2`` when an instance ran twice)
    taken = {t for ts in trajs_of.values() for t in ts}
    uses: dict[str, int] = {}

    def run_ids(trace_ids: list[str]) -> list[DrawnTrajectory]:
        out = []
        for tid in trace_ids:
            k = uses.get(tid, 0) + 1
            while k > 1 and f"{tid}#{k}" in taken:
                k += 1
            uses[tid] = k
            out.append(DrawnTrajectory(tid if k == 1 else f"{tid}#{k}", tid))
        return out

    steps: list[list[DrawnTrajectory]] = []
    if "step" in df.columns:
        first = df.drop_duplicates("trajectory_id", keep="first")
        step_values = np.unique(first["step"].to_numpy(dtype=np.int64))
        step_of = dict(zip(first["trajectory_id"].tolist(),
                           first["step"].to_numpy(dtype=np.int64).tolist(), strict=True))
        if num_steps > MAX_TASK_DRAWS:
            raise ConfigError(f"steps={num_steps:,}: expected at most {MAX_TASK_DRAWS:,}")
        for s in range(num_steps):
            value = int(step_values[s % len(step_values)])
            chosen: list[str] = []
            tasks_taken = 0
            for task in order:
                members = [t for t in trajs_of[task] if step_of[t] == value]
                if not members:
                    continue
                if tasks_per_step is not None and tasks_taken >= tasks_per_step:
                    break
                tasks_taken += 1
                chosen.extend(_cap(members, samples_per_task, parents))
            steps.append(run_ids(chosen))
        return steps

    k = tasks_per_step if tasks_per_step is not None else max(1, len(order) // num_steps)
    if num_steps * k > MAX_TASK_DRAWS:
        raise ConfigError(
            f"steps={num_steps} x tasks_per_step={k} would draw {num_steps * k:,} tasks; "
            f"expected at most {MAX_TASK_DRAWS:,} (the trace has {len(order):,} tasks)"
        )
    for s in range(num_steps):
        chosen = []
        for i in range(s * k, s * k + k):
            chosen.extend(_cap(trajs_of[order[i % len(order)]], samples_per_task, parents))
        steps.append(run_ids(chosen))
    return steps
