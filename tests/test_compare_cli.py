"""`rlsched compare` / `rlsched run` end to end on small traces, and their bad-input paths."""

from pathlib import Path

import pandas as pd
import pytest

from rlsched.cli import main
from rlsched.traces import write_trace

SMALL = ["--gpus", "16", "--steps", "2", "--tasks-per-step", "4", "--samples-per-task", "2"]


def _compare(out: Path, trace: Path, *extra: str) -> int:
    return main(["compare", "--trace", str(trace), "--out", str(out), "--no-report", *SMALL, *extra])


def test_compare_writes_summary_and_records(tmp_path, compare_trace, capsys):
    out = tmp_path / "cmp"
    assert _compare(out, compare_trace, "--policies", "colocated,async,elastic,partial", "--check") == 0
    s = pd.read_csv(out / "summary.csv")
    for col in ("policy", "steps", "sim_seconds", "trained_tokens", "gpu_utilization",
                "max_staleness", "lost_trajectories", "lower_bound_seconds"):
        assert col in s.columns
    assert list(s.policy) == ["colocated", "async", "elastic", "partial"]
    assert (s.sim_seconds >= s.lower_bound_seconds).all()
    assert (s.lost_trajectories == 0).all()
    assert (s.steps == 2).all()
    assert len(list((out / "runs").iterdir())) == 4
    assert not list(tmp_path.glob(".cmp.tmp-*"))


def test_compare_is_deterministic(tmp_path, compare_trace):
    a, b = tmp_path / "a", tmp_path / "b"
    spec = ["--policy", "async:rollout_fraction=0.25", "--policy", "elastic:staleness=1"]
    assert _compare(a, compare_trace, *spec) == 0
    assert _compare(b, compare_trace, *spec) == 0
    # no host time in any file but timing.csv (tests/test_deterministic.py: with the report)
    assert "wall_seconds" not in pd.read_csv(a / "summary.csv").columns
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file() and p.name != "timing.csv")
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file() and p.name != "timing.csv")
    assert [f for f in files if (a / f).read_bytes() != (b / f).read_bytes()] == []


def test_run_without_live_simulates_one_policy(tmp_path, compare_trace):
    out = tmp_path / "run"
    args = ["run", "--policy", "elastic", "--trace", str(compare_trace), "--out", str(out), *SMALL]
    assert main(args) == 0
    assert (out / "summary.csv").exists()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--policies", "colocatd"], "unknown policy 'colocatd' (did you mean 'colocated'?)"),
        (["--policy", "async:rollout_fraction=2"], "rollout_fraction='2': must be <= 0.95"),
        (["--policy", "async:fraction=0.5"], "unknown parameter 'fraction'"),
        (["--policies", "async:staleness=1"], "--policies takes plain names"),
        (["--gpus", "6", "--tp", "4"], "gpus=6 is not a multiple of tp=4"),
        # an empty list used to run the defaults (colocated, async) without a word
        (["--policies", ""], "--policies '': empty name in the list"),
        (["--policies", " "], "--policies ' ': empty name in the list"),
        # (was refused only after colocated had run: async's fixed split fails at its start)
        (["--policies", "colocated,async", "--gpus", "8", "--tp", "2"],
         "policy async cannot run with these settings: a fixed split of 8 GPUs"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, compare_trace, capsys, extra, needle):
    out = tmp_path / "never"
    args = ["compare", "--trace", str(compare_trace), "--out", str(out), "--no-report", *extra]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlsched: error:"), err
    assert needle in err[0]
    assert not out.exists()
    assert not list(tmp_path.glob(".never.tmp-*"))


def test_out_of_memory_is_one_line_and_writes_nothing(tmp_path, compare_trace, capsys, monkeypatch):
    """A cluster too large for the machine (--gpus 100000000: the cluster state alone runs
    out of memory) used to end in a MemoryError traceback."""
    import rlsched.compare

    def too_big(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(rlsched.compare, "simulate", too_big)
    out = tmp_path / "never"
    assert main(["run", "--policy", "colocated", "--trace", str(compare_trace), "--out", str(out), *SMALL]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlsched: error: out of memory:"), err
    assert not out.exists() and not list(tmp_path.glob(".never.tmp-*"))


def test_bad_trace_and_config(tmp_path, compare_trace, capsys):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    assert main(["compare", "--trace", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "bad.parquet" in capsys.readouterr().err
    cfg = tmp_path / "c.toml"
    cfg.write_text("[cluster]\ngpuz = 8\n")
    assert main(["compare", "--trace", str(compare_trace), "--config", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "unknown key 'gpuz' (did you mean 'gpus'?)" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_refuses_non_empty_out_without_force(tmp_path, compare_trace, capsys):
    out = tmp_path / "full"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert _compare(out, compare_trace, "--policies", "colocated") == 2
    assert "not empty" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine"
    assert _compare(out, compare_trace, "--policies", "colocated", "--force") == 0
    assert not (out / "keep.txt").exists()


def test_config_file_supplies_policies_and_cluster(tmp_path, compare_trace):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'trace = "{compare_trace}"\n[cluster]\ngpus = 16\ntp = 2\n[run]\nsteps = 1\n'
        '[[policy]]\nspec = "async:rollout_fraction=0.5,staleness=0"\n[cost]\nswitch_s = 2.0\n'
    )
    out = tmp_path / "o"
    assert main(["compare", "--config", str(cfg), "--out", str(out), "--no-report"]) == 0
    s = pd.read_csv(out / "summary.csv")
    assert list(s.policy) == ["async:rollout_fraction=0.5,staleness=0"]
    assert (s.num_gpus == 16).all()


@pytest.mark.parametrize(("argv", "needle"), [
    (["compare", "--bogus"], "No such option: --bogus"),
    (["compare", "--gpus", "x"], "Invalid value for '--gpus'"),
    (["report"], "Missing argument"),
    (["nope"], "No such command 'nope'"),
])
def test_usage_errors_are_one_line(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rlsched: error: rlsched") and needle in err
    assert "--help" in err


def test_help_shows_config_tables_literally(capsys):
    """Help text names TOML tables in brackets; no markup engine may eat them."""
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "[cluster] [run] [cost] [[policy]]" in out and "first [[policy]]" in out


def test_progress_off_a_terminal_is_plain_lines(tmp_path, compare_trace, capsys, monkeypatch):
    """Off a terminal there is no bar: a policy's last step is always a line; every step is
    one only when RLSCHED_PROGRESS_SECONDS=0 (the default is one line per 10 s)."""
    assert _compare(tmp_path / "a", compare_trace, "--policies", "colocated,async") == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ": step " in ln]
    assert [ln.split("  ")[0] for ln in lines] == ["colocated: step 2/2", "async: step 2/2"]
    monkeypatch.setenv("RLSCHED_PROGRESS_SECONDS", "0")
    assert _compare(tmp_path / "b", compare_trace, "--policies", "colocated") == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ": step " in ln]
    assert [ln.split("  ")[0] for ln in lines] == ["colocated: step 1/2", "colocated: step 2/2"]


def test_large_parquet_traces_are_read_by_step(compare_trace, monkeypatch):
    """Above ``stream_rows`` turns a Parquet trace is not loaded whole (only the tasks the
    run draws are read); the replay gets the same batches and the same per-turn arrays."""
    import numpy as np

    from rlsched.sim import workload as wl

    whole_w, whole_b = wl.replay_workload(compare_trace, 2, 4, 2)
    streamed: list[object] = []
    real = wl.load_workload
    monkeypatch.setattr(wl, "load_workload", lambda *a, **k: streamed.append(a) or real(*a, **k))
    part_w, part_b = wl.replay_workload(compare_trace, 2, 4, 2, stream_rows=10)
    assert len(streamed) == 1
    assert part_b == whole_b
    for tid in {t for b in whole_b for _, t in b}:
        i, j = whole_w.index[tid], part_w.index[tid]
        assert whole_w.turns[i] == part_w.turns[j]
        a, b = slice(whole_w.start[i], whole_w.start[i] + whole_w.turns[i]), slice(part_w.start[j], part_w.start[j] + part_w.turns[j])
        for col in ("prompt", "output", "env"):
            assert np.array_equal(getattr(whole_w, col)[a], getattr(part_w, col)[b]), col


def test_force_never_deletes_where_the_user_stands_or_what_it_reads(tmp_path, compare_trace, capsys,
                                                                    monkeypatch):
    """``--out . --force`` removed everything in the current folder, then failed; a folder
    holding the trace would have been deleted with it; a symbolic link could be neither
    replaced nor followed safely. Each is one line, and nothing is removed."""
    here = tmp_path / "here"
    (here / "sub").mkdir(parents=True)
    (here / "keep.txt").write_text("mine")
    trace = here / "t.parquet"
    trace.write_bytes(compare_trace.read_bytes())
    monkeypatch.chdir(here / "sub")
    (here / "sub" / "x.txt").write_text("x")
    cases = [
        (".", "is the current directory or holds it"),
        ("..", "is the current directory or holds it"),
        (str(here), "is the current directory or holds it"),
    ]
    for out, needle in cases:
        assert main(["compare", "--trace", str(compare_trace), "--out", out, "--no-report", *SMALL,
                     "--policies", "colocated", "--force"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
    monkeypatch.chdir(tmp_path)
    assert _compare(here, trace, "--policies", "colocated", "--force") == 2
    assert f"holds the input {trace}, which --force would delete" in capsys.readouterr().err
    link = tmp_path / "link"
    link.symlink_to(here)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    for out in (link, dangling):
        assert _compare(out, compare_trace, "--policies", "colocated", "--force") == 2
        assert "is a symbolic link" in capsys.readouterr().err
    assert (here / "keep.txt").read_text() == "mine" and trace.exists() and (here / "sub" / "x.txt").exists()
    # a replaced folder leaves no copy of the old one beside it
    out = tmp_path / "again"
    assert _compare(out, compare_trace, "--policies", "colocated") == 0
    assert _compare(out, compare_trace, "--policies", "colocated", "--force") == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_run_that_trains_nothing_says_so(tmp_path, compare_trace, capsys):
    """Contexts longer than an engine's KV end every trajectory timed out before a turn:
    the run 'succeeded' with 0 trained tokens and nothing said it."""
    df = pd.read_parquet(compare_trace)
    df["output_tokens"] = 10**7
    big = tmp_path / "big.parquet"
    write_trace(df, big)
    assert _compare(tmp_path / "o", big, "--policies", "colocated") == 0
    err = capsys.readouterr().err
    assert "warning: colocated trained no tokens" in err
    assert (pd.read_csv(tmp_path / "o" / "summary.csv").trained_tokens == 0).all()
    assert _compare(tmp_path / "o2", compare_trace, "--policies", "colocated") == 0
    assert "trained no tokens" not in capsys.readouterr().err


def test_an_out_that_cannot_be_replaced_keeps_the_new_output(tmp_path, monkeypatch):
    """(An immutable --out made publish fail after the run, and the new output was deleted.)"""
    from rlsched.cluster.errors import ConfigError
    from rlsched.compare import prepare_out_dir, publish

    out = tmp_path / "G"
    out.mkdir()
    (out / "old.txt").write_text("old")
    tmp = prepare_out_dir(out, force=True)
    (tmp / "summary.csv").write_text("new")
    real_rename = Path.rename

    def refuse_out(self, target):  # (what chattr +i on --out does)
        if self == out:
            raise PermissionError(1, "Operation not permitted")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", refuse_out)
    with pytest.raises(ConfigError, match=r"--out .*G: cannot replace it \(Operation not permitted\); "
                                          r"the new output is in .*G\.new-"):
        publish(tmp, out)
    (kept,) = tmp_path.glob("G.new-*")
    assert (kept / "summary.csv").read_text() == "new" and (out / "old.txt").read_text() == "old"


def test_a_spec_that_cannot_run_on_the_cluster_is_refused_before_any_run(tmp_path, compare_trace, capsys,
                                                                          monkeypatch):
    """async's fixed split cannot hold the default preset's 8-GPU trainer floor on 8 GPUs:
    the refusal came from async's own run, after colocated had run (hours, at scale). Each
    spec's first decision is now made before any run: one line naming the spec, no run,
    and the --out that --force would replace is left as it was."""
    import rlsched.compare

    ran: list[object] = []
    real = rlsched.compare.simulate
    monkeypatch.setattr(rlsched.compare, "simulate", lambda *a, **k: ran.append(a) or real(*a, **k))
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    args = ["compare", "--trace", str(compare_trace), "--out", str(out), "--force", "--no-report",
            "--gpus", "8", "--tp", "2", "--steps", "2", "--tasks-per-step", "4"]
    assert main([*args, "--policies", "colocated,async"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("rlsched: error: policy async cannot run with these settings: "
                             "a fixed split of 8 GPUs leaves the trainer 6, below its memory floor of 8")
    assert err[0].endswith("(checked before any run; nothing was run)")
    assert ran == []
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp"]
    # the same settings run the policies that move GPUs between the roles
    assert main([*args, "--policies", "colocated,partial,elastic"]) == 0 and len(ran) == 3
