"""draw_batches: which trajectories each RL step replays."""

from __future__ import annotations

import pandas as pd
import pytest

from rlsched.cluster.errors import ConfigError
from rlsched.traces import draw_batches, generate_trace, validate_trace


def pool(tasks: int = 5, samples: int = 3) -> pd.DataFrame:
    rows = []
    for k in range(tasks):
        for j in range(samples):
            rows.append({"task_id": f"k{k}", "trajectory_id": f"k{k}s{j}", "turn": 0,
                         "prompt_tokens": 10, "output_tokens": 5, "env_seconds": 1.0})
    return validate_trace(pd.DataFrame(rows), "pool")


def trace_ids(step):
    return [t for _, t in step]


def test_default_one_pass_over_the_pool():
    steps = draw_batches(pool(), num_steps=2)
    # 5 tasks // 2 steps = 2 tasks per step, in file order, whole groups.
    assert trace_ids(steps[0]) == ["k0s0", "k0s1", "k0s2", "k1s0", "k1s1", "k1s2"]
    assert trace_ids(steps[1])[0] == "k2s0"
    assert all(run == trace for step in steps for run, trace in step)


def test_cycling_makes_run_ids_unique():
    steps = draw_batches(pool(tasks=3, samples=1), num_steps=4, tasks_per_step=2)
    assert [trace_ids(s) for s in steps] == [["k0s0", "k1s0"], ["k2s0", "k0s0"],
                                             ["k1s0", "k2s0"], ["k0s0", "k1s0"]]
    runs = [run for s in steps for run, _ in s]
    assert len(runs) == len(set(runs))
    assert steps[1][1].run_id == "k0s0#2" and steps[3][0].run_id == "k0s0#3"


def _row(task: str, traj: str) -> dict:
    return {"task_id": task, "trajectory_id": traj, "turn": 0, "prompt_tokens": 10,
            "output_tokens": 5, "env_seconds": 1.0}


def test_cycling_skips_run_ids_that_are_trace_ids():
    # An import of an instance that ran twice holds "a" and "a#2" (traces.import_common).
    # Drawn again, "a" must not become "a#2": the run would hold one id twice (the simulator
    # refused it: "trajectory id 'a#2' appears twice in the run").
    df = validate_trace(pd.DataFrame([_row("a", "a"), _row("a", "a#2"), _row("b", "b")]), "dup")
    steps = draw_batches(df, num_steps=3, tasks_per_step=2)
    runs = [run for s in steps for run, _ in s]
    assert len(runs) == len(set(runs))
    assert [[tuple(d) for d in s] for s in steps] == [
        [("a", "a"), ("a#2", "a#2"), ("b", "b")],
        [("a#3", "a"), ("a#2#2", "a#2"), ("b#2", "b")],
        [("a#4", "a"), ("a#2#3", "a#2"), ("b#3", "b")],
    ]


def test_samples_per_task_caps_groups_but_keeps_parents():
    df = generate_trace("longtail-small", seed=0, tasks=6, branch_frac=1.0)
    steps = draw_batches(df, num_steps=1, tasks_per_step=6, samples_per_task=2)
    chosen = set(trace_ids(steps[0]))
    parents = df.drop_duplicates("trajectory_id").set_index("trajectory_id")[
        "parent_trajectory_id"]
    for tid in chosen:
        p = parents[tid]
        assert p is None or p in chosen  # never an orphaned fork
    per_task = pd.Series([t.split("-")[0] for t in chosen]).value_counts()
    assert (per_task == 2).all()  # parents of the first two samples are among them


def test_step_column_selects_recorded_steps():
    df = pool(tasks=4, samples=2)
    df["step"] = pd.array([5, 5, 5, 5, 7, 7, 7, 7], dtype="Int64")
    steps = draw_batches(df, num_steps=3)
    assert trace_ids(steps[0]) == ["k0s0", "k0s1", "k1s0", "k1s1"]
    assert trace_ids(steps[1]) == ["k2s0", "k2s1", "k3s0", "k3s1"]
    assert steps[2][0] == ("k0s0#2", "k0s0")
    capped = draw_batches(df, num_steps=1, tasks_per_step=1, samples_per_task=1)
    assert trace_ids(capped[0]) == ["k0s0"]


@pytest.mark.parametrize("kwargs", [
    {"num_steps": 0}, {"num_steps": 2, "tasks_per_step": 0},
    {"num_steps": 2, "samples_per_task": -1}, {"num_steps": 1.5},
])
def test_nonsense_counts_raise_config_error(kwargs):
    with pytest.raises(ConfigError):
        draw_batches(pool(), **kwargs)


@pytest.mark.parametrize(("steps", "k"), [(1, 10**12), (10**9, 1), (10**4, 10**4)])
def test_absurd_draw_counts_fail_at_once(steps, k):
    """A mistyped count is one line, not a loop over billions of draws."""
    with pytest.raises(ConfigError, match=r"would draw .* tasks; expected at most 10,000,000"):
        draw_batches(pool(), num_steps=steps, tasks_per_step=k)


def test_absurd_step_count_with_a_step_column_fails_at_once():
    df = pool().assign(step=0)
    with pytest.raises(ConfigError, match="steps=1,000,000,000: expected at most"):
        draw_batches(validate_trace(df, "pool"), num_steps=10**9)
