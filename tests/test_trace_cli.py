"""``rlsched trace gen|inspect|validate`` through the real entry point."""

from __future__ import annotations

import pandas as pd

from rlsched.cli import main
from rlsched.traces import generate_trace, load_trace


def test_gen_writes_the_trace_it_reports(tmp_path, capsys):
    out = tmp_path / "t.parquet"
    code = main(["trace", "gen", "--preset", "longtail-small", "--seed", "5", "--out", str(out),
                 "--tasks", "6", "--samples", "4", "--turns-scale", "0.5",
                 "--tokens-scale", "2"])
    assert code == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "24 trajectories, 6 tasks" in printed
    expected = generate_trace("longtail-small", seed=5, tasks=6, samples=4, turns_scale=0.5,
                              tokens_scale=2.0)
    pd.testing.assert_frame_equal(load_trace(out), expected)


def test_gen_jsonl(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    assert main(["trace", "gen", "--preset", "uniform", "--out", str(out), "--tasks", "2"]) == 0
    assert len(load_trace(out)) == 2 * 8 * 20


def test_validate_ok_and_default_sample(tmp_path, capsys):
    assert main(["trace", "validate"]) == 0
    assert capsys.readouterr().out.strip() == "OK: 22942 rows, 512 trajectories, 64 tasks"
    out = tmp_path / "u.parquet"
    main(["trace", "gen", "--preset", "uniform", "--out", str(out), "--tasks", "3"])
    capsys.readouterr()
    assert main(["trace", "validate", str(out)]) == 0
    assert capsys.readouterr().out.strip() == "OK: 480 rows, 24 trajectories, 3 tasks"


def test_inspect_prints_the_table(capsys):
    assert main(["trace", "inspect"]) == 0
    out = capsys.readouterr().out
    for word in ("turns_per_trajectory", "context_tokens_per_trajectory",
                 "env_seconds_per_turn", "p99", "branched", "truncated"):
        assert word in out


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err and "Traceback" not in captured.out
    return lines[0]


def test_bad_trace_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "a", "trajectory_id": "x", "turn": 0, "prompt_tokens": 3, '
                   '"output_tokens": -1, "env_seconds": 0}\n')
    assert main(["trace", "validate", str(bad)]) == 2
    line = _one_error_line(capsys)
    assert f"{bad}: line 1, column output_tokens: -1 — expected" in line
    assert main(["trace", "inspect", str(tmp_path / "missing.parquet")]) == 2
    assert "no such file" in _one_error_line(capsys)


def test_bad_preset_and_override_exit_2(tmp_path, capsys):
    out = str(tmp_path / "x.parquet")
    assert main(["trace", "gen", "--preset", "swe-sed", "--out", out]) == 2
    assert "did you mean 'swe-seed'" in _one_error_line(capsys)
    assert main(["trace", "gen", "--preset", "uniform", "--tasks", "0", "--out", out]) == 2
    assert "tasks=0" in _one_error_line(capsys)


def test_gen_negative_seed_is_one_line(tmp_path, capsys):
    """numpy refuses a seed below 0 with a bare ValueError: it used to be a traceback."""
    out = str(tmp_path / "x.parquet")
    assert main(["trace", "gen", "--seed", "-1", "--out", out]) == 2
    # (named the generator's function, "generate_trace: seed=-1 — ...", until session 22)
    assert _one_error_line(capsys) == "rlsched: error: --seed=-1: expected a whole number >= 0"
    like = tmp_path / "like.parquet"
    assert main(["trace", "gen", "--preset", "uniform", "--tasks", "2", "--out", str(like)]) == 0
    capsys.readouterr()
    assert main(["trace", "gen", "--like", str(like), "--seed", "-1", "--out", out]) == 2
    # (named the generator's function, "generate_trace: seed=-1 — ...", until session 22)
    assert _one_error_line(capsys) == "rlsched: error: --seed=-1: expected a whole number >= 0"


def test_gen_like_refuses_zero_counts_and_options_it_cannot_honour(tmp_path, capsys):
    """With --like, --tasks 0 used to mean the default 64 tasks (``tasks or 64``) and
    --turns-scale/--tokens-scale/--growth were silently ignored."""
    like = tmp_path / "like.parquet"
    assert main(["trace", "gen", "--preset", "uniform", "--tasks", "2", "--out", str(like)]) == 0
    capsys.readouterr()
    out = tmp_path / "x.parquet"
    for flag in ("--tasks", "--samples"):
        assert main(["trace", "gen", "--like", str(like), flag, "0", "--out", str(out)]) == 2
        assert f"{flag}=0: expected a whole number >= 1" in _one_error_line(capsys)
    for flag in ("--turns-scale", "--tokens-scale", "--growth"):
        assert main(["trace", "gen", "--like", str(like), flag, "2", "--out", str(out)]) == 2
        assert f"{flag} does not apply with --like" in _one_error_line(capsys)
    assert not out.exists()


def test_gen_token_scale_past_the_schema_bound_is_one_line(tmp_path, capsys):
    """Token counts past 2**62 used to overflow the int64 cast (a RuntimeWarning on stderr)
    and then fail validation as a row of the output file the user never wrote."""
    out = tmp_path / "x.parquet"
    assert main(["trace", "gen", "--tokens-scale", "1e16", "--out", str(out)]) == 2
    line = _one_error_line(capsys)
    # (named the generator's record, "GenParams.tokens_scale=1e+16", until session 22)
    assert line.startswith("rlsched: error: --tokens-scale=1e+16: ") and "2**62" in line
    assert not out.exists()


def test_a_trace_file_name_without_a_trace_suffix_is_refused(tmp_path, capsys):
    """``trace gen --out g.csv`` wrote Parquet under a .csv name (as did ``trace import``)."""
    out = tmp_path / "g.csv"
    assert main(["trace", "gen", "--tasks", "2", "--out", str(out)]) == 2
    assert "expected a trace file name ending in .parquet" in _one_error_line(capsys)
    assert not out.exists()
    assert main(["trace", "gen", "--tasks", "2", "--out", str(tmp_path / "g.jsonl")]) == 0
