"""report.html end to end: files, CSVs, the command line, and the page in a real headless
browser (every image decodes, nothing logged to the console)."""

import base64
import os
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from conftest_analysis import HAND_INTERVALS, write_run

from rlsched.analysis.load import load_run
from rlsched.analysis.metrics import SUMMARY_COLUMNS
from rlsched.analysis.report import RunInfo, _trace_section, compute_tables, write_report
from rlsched.analysis.tables import SCRIPT
from rlsched.cli import main
from rlsched.cluster.errors import RecordError
from rlsched.traces import write_trace

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not on PATH (apt-get install chromium; .ci/run installs it)"
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("runs")
    trace = pd.DataFrame({
        "task_id": ["t0", "t0", "t0", "t1"], "trajectory_id": ["a", "a", "b", "c"], "turn": [0, 1, 0, 0],
        "prompt_tokens": [10, 5, 10, 20], "output_tokens": [3, 4, 30, 300], "env_seconds": [1.0, 0.0, 2.0, 9.0],
    })
    tpath = write_trace(trace, tmp_path / "trace.parquet")
    slower = [(g, c, s * 1.5, e * 1.5, st, step) for g, c, s, e, st, step in HAND_INTERVALS]
    return [
        write_run(tmp_path / "runs" / "00-hand", trace=str(tpath)),
        write_run(tmp_path / "runs" / "01-slow", intervals=slower, makespan_seconds=15.0,
                  policy="slow:x=1", trace=str(tpath), spec_as_given="slow:x=1"),
    ]


@pytest.fixture(scope="module")
def page(runs):
    # one rendered report shared by the tests that only read it (rendering takes seconds)
    return write_report(runs, runs[0].parent.parent / "out", title="Hand <runs>")


def test_write_report_files_and_csvs(page):
    out = page.parent
    assert page == out / "report.html"
    for name in ("summary.csv", "breakdown.csv", "bubbles.csv", "staleness.csv", "waste.csv",
                 "length_bias.csv", "step_times.csv"):
        assert (out / name).stat().st_size > 0, name
    summary = pd.read_csv(out / "summary.csv")
    assert tuple(summary.columns[: len(SUMMARY_COLUMNS)]) == SUMMARY_COLUMNS
    assert summary["policy"].tolist() == ["hand:k=2", "slow:x=1"]
    assert summary["run_dir"].tolist() == ["../runs/00-hand", "../runs/01-slow"]
    assert summary["gpu_utilization"].tolist() == pytest.approx([0.45, 0.45])
    bd = pd.read_csv(out / "breakdown.csv")
    assert bd.groupby("policy")["fraction"].sum().tolist() == pytest.approx([1.0, 1.0])
    html = page.read_text()
    assert "<title>Hand &lt;runs&gt;</title>" in html
    # self-contained: images inline, nothing fetched from anywhere
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:)""", html)
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(images) >= 8  # breakdown, steps, 2 x (utilization, timeline), staleness, trace CDFs
    assert all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    assert "hand:k=2 spent 35% generating" in html
    assert "turns_per_trajectory" in html  # trace statistics
    assert "sync_latency_s" in html  # cost model
    assert "25% above the lower bound" in html


def test_compare_layout_keeps_run_dirs_relative(runs):
    # rlsched compare writes its report into the folder that holds runs/
    t = compute_tables([load_run(d) for d in runs], runs[0].parent.parent)
    assert t.summary["run_dir"].tolist() == ["runs/00-hand", "runs/01-slow"]


def test_duplicate_policies_get_distinct_names(tmp_path):
    a = load_run(write_run(tmp_path / "a"))
    b = load_run(write_run(tmp_path / "b"))
    assert compute_tables([a, b], tmp_path).names == ("hand:k=2 [a]", "hand:k=2 [b]")
    assert compute_tables([a, a], tmp_path).summary["policy"].tolist() == ["hand:k=2 [a] #1", "hand:k=2 [a] #2"]


def test_unreadable_trace_is_a_note_not_a_failure(tmp_path):
    d = load_run(write_run(tmp_path / "r", trace="nowhere/trace.parquet"))
    assert "not readable from here" in _trace_section([RunInfo("r", d.path, d.meta, "r")])


def test_empty_record_of_a_run_that_stopped_at_once(tmp_path):
    d = write_run(tmp_path / "r", intervals=[], events=[], trajectories=[], steps=[], makespan_seconds=0.0,
                  complete=False, steps_done=0, lower_bound_seconds=None)
    write_report([d], tmp_path / "out")
    row = pd.read_csv(tmp_path / "out" / "summary.csv").iloc[0]
    assert (row["steps"], row["trained_tokens"], row["lost_trajectories"]) == (0, 0, 0)


def test_bad_inputs_are_record_errors(tmp_path):
    with pytest.raises(RecordError, match="no run directories"):
        write_report([], tmp_path / "out")
    with pytest.raises(RecordError, match="not a run directory"):
        write_report([tmp_path / "missing"], tmp_path / "out")
    d = write_run(tmp_path / "r")
    (tmp_path / "file").write_text("x")
    with pytest.raises(RecordError, match="exists and is not a directory"):
        write_report([d], tmp_path / "file")


def test_out_below_a_file_is_a_record_error(tmp_path, capsys):
    """--out below a file (no folder can be made there) used to be a NotADirectoryError
    traceback from mkdir."""
    d = write_run(tmp_path / "r")
    (tmp_path / "file").write_text("x")
    with pytest.raises(RecordError, match=r"file/x: cannot write the report there \(Not a directory\)"):
        write_report([d], tmp_path / "file" / "x")
    assert main(["report", str(d), "--out", str(tmp_path / "file" / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot write the report there" in err


def test_cli_report(runs, tmp_path, capsys):
    # a compare output folder stands for its runs/
    assert main(["report", str(runs[0].parent.parent), "--out", str(tmp_path / "cli")]) == 0
    assert "report:" in capsys.readouterr().out
    assert (tmp_path / "cli" / "report.html").is_file()
    assert pd.read_csv(tmp_path / "cli" / "summary.csv")["policy"].tolist() == ["hand:k=2", "slow:x=1"]


def test_cli_report_default_out(runs, tmp_path, monkeypatch, capsys):
    import shutil as sh

    one = tmp_path / "one"
    sh.copytree(runs[0], one)
    assert main(["report", str(one)]) == 0  # one run: RUN/report
    assert (one / "report" / "report.html").is_file()
    assert f"report: {one / 'report' / 'report.html'}" in capsys.readouterr().out
    cmp = tmp_path / "cmp"
    sh.copytree(runs[0].parent.parent / "runs", cmp / "runs")
    assert main(["report", str(cmp)]) == 0  # one compare folder: its report/ too
    assert pd.read_csv(cmp / "report" / "summary.csv")["policy"].tolist() == ["hand:k=2", "slow:x=1"]
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(one), str(cmp / "runs" / "01-slow")]) == 0  # several: ./rlsched-report
    assert pd.read_csv(tmp_path / "rlsched-report" / "summary.csv")["policy"].tolist() == ["hand:k=2", "slow:x=1"]
    assert main(["report", str(tmp_path / "nowhere")]) == 2  # a bad path creates no folder
    assert not (tmp_path / "nowhere").exists()


def test_cli_report_open_hands_the_page_to_the_browser(runs, tmp_path, monkeypatch):
    opened = []  # fake browser: records the URI instead of starting one
    monkeypatch.setattr("webbrowser.open", lambda uri: opened.append(uri) or True)
    assert main(["report", str(runs[0]), "--out", str(tmp_path / "o"), "--open"]) == 0
    assert opened == [(tmp_path / "o" / "report.html").absolute().as_uri()]


def test_cli_report_bad_dir_is_one_line(tmp_path, capsys):
    (tmp_path / "broken").mkdir()
    assert main(["report", str(tmp_path / "broken"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlsched: error: ") and err.count("\n") == 1 and "missing meta.json" in err


def _chromium(url: str, profile: Path, screenshot: Path) -> tuple[str, str]:
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
        f"--screenshot={screenshot}", "--window-size=1400,3000", "--dump-dom", url,
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout, p.stderr


def _console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@needs_chromium
def test_report_renders_in_headless_chromium(page, tmp_path):
    shot = tmp_path / "report.png"
    dom, err = _chromium(page.absolute().as_uri(), tmp_path / "profile", shot)
    n = len(re.findall(r"<img ", page.read_text()))
    assert 'data-images-ok="true"' in dom, "an image did not load in the browser"
    assert f'data-images="{n}"' in dom
    assert _console_lines(err) == [], "the page logged to the console"
    assert shot.stat().st_size > 50_000
    print(f"report screenshot: {shot}")
    target = os.environ.get("RLSCHED_SCREENSHOT_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(target) / "report-screenshot.png")


@needs_chromium
def test_browser_check_catches_a_broken_image_and_console_errors(tmp_path):
    # the same self-check script on a page with an undecodable image and a script error
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!DOCTYPE html><html><head><title>bad</title></head><body>"
        "<img alt='x' src='data:image/png;base64,AAAA'><script>notDefined();</script>"
        f"<script>{SCRIPT}</script></body></html>"
    )
    dom, err = _chromium(bad.as_uri(), tmp_path / "profile", tmp_path / "bad.png")
    assert 'data-images-ok="false"' in dom
    assert any("Uncaught ReferenceError" in line for line in _console_lines(err))


def test_a_compare_folder_of_incomplete_runs_names_the_run(tmp_path, capsys):
    """(It blamed the compare folder for a meta.json a compare folder never has.)"""
    (tmp_path / "cmp" / "runs" / "00-elastic").mkdir(parents=True)
    assert main(["report", str(tmp_path / "cmp"), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'cmp' / 'runs' / '00-elastic'}: missing meta.json" in err
