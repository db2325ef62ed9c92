"""Each new format end to end through the real command line: ``rlsched trace import`` on the
fixture (plus an unknown-shape log, skipped with one line while the import goes on), then
``rlsched trace validate`` and a ``rlsched compare --trace`` replay of the written trace."""

from __future__ import annotations

import pandas as pd
import pytest
from importkit import FIXTURES

from rlsched.cli import main

CASES = {
    "openhands": ([FIXTURES / "openhands"], FIXTURES / "unknown" / "metrics.jsonl", 4,
                  "tokens: the model API's recorded usage on 9 of 14 turns, the rest counted "
                  "with estimate:chars/4 (column token_source)"),
    "mini-swe-agent": ([FIXTURES / "mini_swe_agent"], FIXTURES / "unknown" / "run_config.json",
                       3, "tokens: the model API's recorded usage on 8 of 11 turns"),
    "verl": ([FIXTURES / "verl" / "rollout"], FIXTURES / "unknown" / "metrics.jsonl", 6,
             "tokens counted with estimate:chars/4 (pass --tokenizer DIR for exact counts)"),
}


@pytest.mark.parametrize("fmt", list(CASES))
def test_import_validate_and_replay(fmt, tmp_path, capsys):
    inputs, unknown, trajectories, tokens_line = CASES[fmt]
    trace = tmp_path / f"{fmt}.parquet"
    code = main(["trace", "import", "--format", fmt, *map(str, inputs), str(unknown),
                 "--out", str(trace)])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"imported {trajectories} trajectories ")
    skips = [line for line in lines if line.startswith(f"  skipped {unknown}: ")]
    assert len(skips) == 1, out  # one line for the unknown file, and the import went on
    assert any(line.startswith(tokens_line) for line in lines), out
    assert f"wrote {trace}" in out

    assert main(["trace", "validate", str(trace)]) == 0
    assert capsys.readouterr().out.startswith("OK: ")

    run = tmp_path / "cmp"
    code = main(["compare", "--trace", str(trace), "--policies", "colocated,async",
                 "--gpus", "8", "--tp", "2", "--steps", "2", "--model", "none", "--out", str(run), "--no-report"])
    assert code == 0, capsys.readouterr().err
    summary = pd.read_csv(run / "summary.csv")
    assert summary["policy"].tolist() == ["colocated", "async"]
    assert (summary["steps"] == 2).all() and (summary["lost_trajectories"] == 0).all()
    assert (summary["trained_tokens"] > 0).all() and (summary["sim_seconds"] > 0).all()
