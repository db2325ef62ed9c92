"""Issue #22/#23: the shipped elastic policy steals live (``Move``), and nothing is lost.

Elastic steals by default: an engine left in rollout with nothing to do takes the live
trajectory predicted longest off an engine holding three or more. Live that was refused
(``Move`` was simulator-only), so an elastic run with two engines could crash mid-run.
Here two engines roll out one step of eight trajectories with ``pack=2`` (an engine may
hold twice an even spread): the engine that boots first takes seven of them, the other
one (the eighth is held for it) is soon idle and steals; ``tail=0`` keeps both engines
in rollout until the step is done. ``max_num_seqs = 2`` makes the seven run in waves, so
the first engine is still crowded when the other empties however fast the host is (an
unloaded host decoded seven as fast as one, and nothing was left to steal). Checked: ``Move`` rows (and ``Migrate`` for those whose
context moved), every trajectory trained (``lost_trajectories == 0``), no generated token
thrown away, and each moved trajectory finished on the engine it was moved to.
"""

from __future__ import annotations

import pandas as pd
import pytest

pytestmark = pytest.mark.live


def test_live_elastic_with_two_engines_steals_and_loses_nothing(tiny_cache, tmp_path) -> None:
    from rlsched.analysis.load import check_record
    from rlsched.cluster.config import RunConfig
    from rlsched.cluster.record import read_run
    from rlsched.policies import make_policy_and_spec
    from rlsched.real.run import run_live

    live = {"tasks": ["fix-clamp", "fix-average-empty"], "tasks_per_step": 2, "samples_per_task": 4,
            "max_turns": 3, "max_tokens_per_turn": 48, "max_num_seqs": 2, "kv_cache_mb": 64, "tool_seconds": 5.0,
            "max_wall_s": 600.0, "cache_dir": str(tiny_cache)}
    out = run_live("elastic:pack=2,tail=0", make=make_policy_and_spec, steps=1, out_dir=tmp_path / "run",
                   config={"run": RunConfig(gpus=2, tp=1, steps=1), "live": live}, seed=0)
    rec = read_run(out)
    check_record(rec)
    assert rec.meta["complete"]
    ev = rec.events.sort_values("time", kind="stable")
    moves = ev[ev["kind"] == "Move"]
    assert len(moves) >= 1, "elastic never stole: " + str(ev.loc[ev["kind"] == "Dispatch", ["engine", "detail"]].values)
    tr = rec.trajectories.set_index("trajectory")
    assert set(tr["status"]) == {"trained"}  # lost_trajectories == 0
    assert (tr["wasted_tokens"] == 0).all()
    assert int(tr["output_tokens"].sum()) == rec.meta["measurements"]["tokens_generated"]  # (all kept)
    trace = pd.read_parquet(out / "trace.parquet")
    assert (trace.groupby("trajectory_id")["output_tokens"].sum().reindex(tr.index) == tr["output_tokens"]).all()
    fin = ev[ev["kind"] == "TrajectoryFinished"].set_index("trajectory")["engine"]
    for tid, dest in zip(moves["trajectory"], moves["engine"], strict=True):
        assert int(fin[tid]) == int(dest), f"{tid} moved to engine {dest} but finished on {fin[tid]}"
    migrated = ev.loc[ev["kind"] == "Migrate", "trajectory"]
    assert set(migrated) <= set(moves["trajectory"])
    assert (tr.loc[list(migrated), "migrations"] == 1).all()
    print(f"\nlive elastic steal: {len(moves)} Move rows, {len(migrated)} with their context "
          f"({int((ev['detail'].str.startswith('moved mid-turn')).sum())} mid-turn), "
          f"makespan {rec.meta['makespan_seconds']:.1f}s")
