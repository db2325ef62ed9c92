"""``bench/bench_fidelity.py``'s ranking check: a tie in the replay is not an order."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd


def _bench():
    path = Path(__file__).resolve().parents[1] / "bench" / "bench_fidelity.py"
    spec = importlib.util.spec_from_file_location("bench_fidelity", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_near_equal_steps_per_hour_rank_as_a_tie() -> None:
    ordered = _bench().ordered
    # the quiet-host replay of issue #11: elastic and colocated 157.8632 vs 157.8632 steps/h
    rank = pd.DataFrame({"policy": ["colocated", "async", "elastic"],
                         "live": [157.3, 1080.4, 161.1], "sim": [157.863183, 1006.8, 157.863213]})
    assert ordered(rank, "live", 0.1) == "async > elastic > colocated"
    assert ordered(rank, "sim", 0.1) == "async > colocated = elastic"
    assert ordered(rank, "sim", 0.0) == "async > elastic > colocated"  # no tolerance: any difference orders
