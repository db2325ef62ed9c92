"""``bench/no_harm.py``: the do-no-harm sample the README's figures come from -- the same
seed draws the same cases, every line holds elastic against its baseline, and a bad spec is
one clear line."""

from __future__ import annotations

import csv
import importlib.util
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "no_harm.py"


@pytest.fixture(scope="module")
def no_harm():
    spec = importlib.util.spec_from_file_location("no_harm", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["no_harm"] = mod  # (dataclasses resolve their module's annotations through it)
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("no_harm", None)


def test_a_seed_draws_the_readme_sample(no_harm) -> None:
    # the README's uniform sample is --seed 1: its first two cases, in this order
    Case = no_harm.Case
    assert no_harm.draw_cases("uniform", 2, 1, flat=False) == [
        Case("uniform", 267459, 4, 4, 2, 6, 6, 0.3), Case("uniform", 827036, 4, 2, 8, 8, 6, 0.1)]
    cases = no_harm.draw_cases("tool-heavy", 50, 7, flat=False)
    assert cases == no_harm.draw_cases("tool-heavy", 50, 7, flat=False)
    assert all(c.tp * c.engines >= 12 and c.tp in (2, 4, 8) for c in cases)  # (the trainer's floor)
    flat = no_harm.draw_cases("uniform", 50, 7, flat=True)
    assert any(c.tp * c.engines < 12 for c in flat) and {c.tp for c in flat} <= {1, 2, 4, 8}


def test_a_case_holds_elastic_to_colocated_and_the_best_async(no_harm) -> None:
    case = no_harm.Case("longtail-small", 508595, 6, 2, 8, 2, 3, 0.1)
    got, o = no_harm.run_case((case, False, "elastic", "elastic:staleness=1"))
    assert got == case
    assert o.best_fraction in no_harm.FRACTIONS
    spec = f"async:rollout_fraction={o.best_fraction},staleness=1"
    _, o2 = no_harm.run_case((case, False, "colocated", spec))
    assert o2.elastic_k0 == pytest.approx(o.colocated) and o2.gap_k0 == pytest.approx(0.0)
    assert o2.elastic_k1 == pytest.approx(o.best_async) and o2.gap_k1 == pytest.approx(0.0)
    assert o.gap_k1 == pytest.approx(o.elastic_k1 / o.best_async - 1.0)


def test_the_script_prints_a_line_per_case_and_a_summary(no_harm, tmp_path, capsys) -> None:
    out = tmp_path / "sample.csv"
    assert no_harm.main(["--preset", "longtail-small", "--cases", "2", "--seed", "3", "--workers", "1",
                         "--csv", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[0].startswith("('longtail-small',")
    assert lines[2].startswith("staleness 0: ") and lines[3].startswith("staleness 1: ")
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 2 and {"colocated", "best_async", "elastic_k1", "gap_k1"} <= set(rows[0])
    for r in rows:
        assert not math.isnan(float(r["gap_k1"]))
        assert float(r["gap_k0"]) == pytest.approx(float(r["elastic_k0"]) / float(r["colocated"]) - 1)


def test_an_unknown_policy_spec_is_one_line(no_harm, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        no_harm.main(["--preset", "uniform", "--k1", "nosuch:staleness=1"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "nosuch" in err
