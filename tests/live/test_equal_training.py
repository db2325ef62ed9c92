"""Issue #12, item 9 -- equal training: with staleness 0, ``elastic`` trains every step on
exactly the trajectories, at exactly the policy version, that ``colocated`` does. Both run
live for two steps with the same seed; their run records are compared step by step.

What is compared is the set of (trajectory, version it was trained at, oldest and newest
version that generated its kept tokens) per step -- the schedule may differ (elastic
streams micro-batches while the tail still rolls out), what is trained may not.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.live

TINY = {  # 2 tasks x 2 samples, 2 turns of at most 16 tokens: a short live CI stage
    "tasks": ["fix-clamp", "fix-last-item"], "tasks_per_step": 2, "samples_per_task": 2,
    "max_turns": 2, "max_tokens_per_turn": 16, "kv_cache_mb": 64, "tool_seconds": 5.0,
    "max_wall_s": 900.0,
}


def _trained(out) -> dict[int, set[tuple[str, int, int, int]]]:
    from rlsched.analysis.load import check_record
    from rlsched.cluster.record import read_run

    rec = read_run(out)
    check_record(rec)
    assert rec.meta["complete"] and rec.meta["steps_done"] == 2
    tr = rec.trajectories
    assert set(tr["status"]) == {"trained"}, tr[["trajectory", "status"]]
    by_step: dict[int, set[tuple[str, int, int, int]]] = {}
    for row in tr.itertuples():
        by_step.setdefault(int(row.step), set()).add(
            (row.trajectory, int(row.trained_version), int(row.min_version), int(row.max_version)))
    return by_step


def test_elastic_trains_what_colocated_trains(tiny_cache, tmp_path) -> None:
    from rlsched.cluster.config import RunConfig
    from rlsched.policies import make_policy_and_spec
    from rlsched.real.run import run_live

    config = {"run": RunConfig(gpus=2, tp=1, steps=2), "live": {**TINY, "cache_dir": str(tiny_cache)}}
    runs = {}
    # tail=1.0: elastic hands an engine to the trainer as soon as one trajectory is done, so
    # the step really is split between rollout and streamed training.
    for spec in ("colocated", "elastic:tail=1.0,staleness=0"):
        out = run_live(spec, make=make_policy_and_spec, steps=2, out_dir=tmp_path / spec.split(":")[0], config=config, seed=0)
        runs[spec] = _trained(out)
    colocated, elastic = runs.values()
    assert sorted(colocated) == [0, 1]
    for step in (0, 1):
        assert len(colocated[step]) == 4
        assert {(t, v) for t, v, _, _ in colocated[step]} == {(t, step) for t, *_ in colocated[step]}
        assert elastic[step] == colocated[step], f"step {step}: elastic {sorted(elastic[step])} != colocated {sorted(colocated[step])}"
