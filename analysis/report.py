"""``report.html``: one self-contained page comparing the runs given, plus CSV exports.

The page embeds its PNG plots as base64 data URIs and carries its CSS inline, so it can be
mailed or opened offline. A tiny inline script marks the page (``data-images-ok`` on
``<html>``) once every image has decoded, which is how the tests check the page in a
headless browser. Next to it: ``summary.csv`` (same columns and rows ``rlsched compare``
writes), ``breakdown.csv``, ``bubbles.csv``, ``staleness.csv``, ``waste.csv``,
``length_bias.csv``, ``step_times.csv``, ``critical_path.csv`` (each step along its critical
path, :mod:`.critical`) -- and ``learning.csv`` when a run recorded
learning figures (a live run: reward, loss, KL to the starting policy, token staleness,
clipping per step; :mod:`.learning`), which is also when the page has a Learning section.
"""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from rlsched.cluster.errors import RecordError, RlschedError
from rlsched.cluster.record import RunRecord, read_run

from . import plots
from .breakdown import breakdown, bubbles, sandbox_windows
from .comparable import run_trace, setup_warning
from .critical import critical_path
from .learning import learning_table
from .load import load_run
from .metrics import (
    SUMMARY_COLUMNS,
    label,
    length_bias,
    staleness_table,
    step_times,
    summarize,
    waste_table,
)
from .narrative import describe
from .stream import IntervalSummary, summarize_intervals
from .style import png_bytes
from .tables import CSS, SCRIPT, fmt_table, kv_table


@dataclass(frozen=True)
class RunInfo:
    """What the page needs of a run once its big tables are gone."""

    name: str  # unique label in this report
    path: Path
    meta: dict[str, Any]
    run_dir: str  # as seen from the report's folder


@dataclass(frozen=True)
class Tables:
    """Every metric table of the report, one row (or block of rows) per run."""

    summary: pd.DataFrame
    breakdown: pd.DataFrame
    bubbles: pd.DataFrame
    staleness: pd.DataFrame
    waste: pd.DataFrame
    length_bias: pd.DataFrame
    step_times: pd.DataFrame
    runs: tuple[RunInfo, ...] = ()
    learning: pd.DataFrame | None = None  # per-step learning figures of the runs that have them
    critical: pd.DataFrame | None = None  # each step along its critical path (.critical), per run

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.runs)


def _unique_names(records: Sequence[RunRecord]) -> list[str]:
    """Policy labels, made unique with the run folder's name where two runs share one."""
    names = [label(r) for r in records]
    names = [n if names.count(n) == 1 else f"{n} [{r.path.name}]" for n, r in zip(names, records, strict=True)]
    return [n if names.count(n) == 1 else f"{n} #{i + 1}" for i, n in enumerate(names)]


def _rel(path: Path, base: Path) -> str:
    """Where the run lives, seen from the report's folder (so the folder can be moved)."""
    try:
        return Path(os.path.relpath(path.absolute(), base.absolute())).as_posix()
    except ValueError:  # another drive on Windows
        return str(path.absolute())


def run_tables(rec: RunRecord, name: str, run_dir: str, streamed: IntervalSummary | None = None) -> dict[str, Any]:
    """One run's contribution to every table (its rows carry ``policy = name``);
    ``streamed``: its intervals reduced in one pass (else ``rec.intervals`` is used)."""
    crit = critical_path(rec)
    row = {**summarize(rec, streamed, crit), "policy": name, "run_dir": run_dir}
    crit.insert(0, "policy", name)
    out: dict[str, Any] = {"summary": row, "critical": crit}
    for key, df in (("breakdown", breakdown(rec, streamed)), ("staleness", staleness_table(rec)),
                    ("length_bias", length_bias(rec)), ("step_times", step_times(rec))):
        df["policy"] = name
        out[key] = df
    out["bubbles"] = {**bubbles(rec, streamed), "policy": name}
    out["waste"] = {**waste_table(rec), "policy": name}
    learning = learning_table(rec)
    if not learning.empty:
        learning.insert(0, "policy", name)
        out["learning"] = learning
    return out


def _assemble(parts: Sequence[dict[str, Any]], runs: Sequence[RunInfo]) -> Tables:
    summary = pd.DataFrame([p["summary"] for p in parts])
    summary = summary[[*SUMMARY_COLUMNS, *[c for c in summary.columns if c not in SUMMARY_COLUMNS]]]

    def cat(key: str) -> pd.DataFrame:
        return pd.concat([p[key] for p in parts], ignore_index=True)

    learning = [p["learning"] for p in parts if "learning" in p]
    return Tables(
        summary, cat("breakdown"), pd.DataFrame([p["bubbles"] for p in parts]), cat("staleness"),
        pd.DataFrame([p["waste"] for p in parts]), cat("length_bias"), cat("step_times"), tuple(runs),
        pd.concat(learning, ignore_index=True) if learning else None, cat("critical"),
    )


def compute_tables(records: Sequence[RunRecord], out_dir: Path) -> Tables:
    """All tables for records already in memory (``write_report`` streams instead)."""
    runs = [RunInfo(n, r.path, r.meta, _rel(r.path, out_dir)) for n, r in zip(_unique_names(records), records, strict=True)]
    return _assemble([run_tables(r, i.name, i.run_dir) for r, i in zip(records, runs, strict=True)], runs)


def _run_figures(rec: RunRecord, name: str, streamed: IntervalSummary | None = None) -> str:
    n, span = int(rec.meta["num_gpus"]), float(rec.meta["makespan_seconds"])
    source = rec.intervals if streamed is None else streamed
    util = plots.plot_utilization(source, n, span, title=f"GPU use over time: {name}")
    gantt = plots.plot_timeline(source, n, span, title=f"GPU timeline: {name}")
    return (f"<h3>{html.escape(name)}</h3>" + _img(png_bytes(util.figure), f"utilization over time, {name}")
            + _img(png_bytes(gantt.figure), f"GPU timeline, {name}"))


def _release_memory() -> None:
    """Hand a finished run's memory back before the next one is read (Arrow's allocator
    otherwise keeps freed pages, and peak memory would grow with the number of runs)."""
    import gc

    import pyarrow as pa

    gc.collect()
    pa.default_memory_pool().release_unused()


def stream_run(path: Path) -> tuple[RunRecord, IntervalSummary]:
    """A run record without its GPU intervals in memory, and those intervals reduced in one
    pass over ``intervals.parquet`` (:mod:`.stream`): what every table and plot needs."""
    rec = load_run(path, intervals=False)
    ws, we, _ = sandbox_windows(rec)
    streamed = summarize_intervals(
        rec.path / "intervals.parquet", int(rec.meta["num_gpus"]), float(rec.meta["makespan_seconds"]),
        sandbox=(ws, we),
    )
    return rec, streamed


def collect(run_dirs: Sequence[Path], out_dir: Path) -> tuple[Tables, dict[str, str]]:
    """Tables and per-run figures, one run at a time.

    Every directory's meta is read (and checked) before any heavy work, so a bad path fails
    at once; then each record's intervals are read once, row group by row group, into the
    sums, grid and bubbles the tables and plots need (:func:`stream_run`), so the memory
    is that of one row group and one run's small tables, however large the runs and
    however many policies are compared."""
    heads = [read_run(d, tables=()) for d in run_dirs]
    runs = [RunInfo(n, h.path, h.meta, _rel(h.path, out_dir)) for n, h in zip(_unique_names(heads), heads, strict=True)]
    parts, figures = [], {}
    for info in runs:
        rec, streamed = stream_run(info.path)
        parts.append(run_tables(rec, info.name, info.run_dir, streamed))
        figures[info.name] = _run_figures(rec, info.name, streamed)
        del rec, streamed
        _release_memory()
    return _assemble(parts, runs), figures


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></figure>'


def _trace_path(run: RunInfo) -> Path | None:
    return run_trace(run.path, run.meta)


TRACE_STAT_COLUMNS = (
    "task_id", "trajectory_id", "turn", "prompt_tokens", "output_tokens", "env_seconds",
    "parent_trajectory_id", "truncated",
)
TRACE_VALIDATE_MAX_BYTES = 20_000_000


def _read_trace(path: Path, load_trace: Any) -> pd.DataFrame:
    """The trace's columns that the statistics need.

    Small traces go through ``load_trace`` (full validation). A large Parquet trace was
    validated when the run replayed it; validating it again would double the report's
    memory (a seed-scale trace needs ~1.6 GB to validate), so only the needed columns are
    read, ids dictionary-encoded, and a broken file is still one clear line.
    """
    if path.suffix.lower() not in (".parquet", ".pq") or path.stat().st_size <= TRACE_VALIDATE_MAX_BYTES:
        return load_trace(path)
    import pyarrow.parquet as pq

    try:
        names = set(pq.read_schema(path).names)
        cols = [c for c in TRACE_STAT_COLUMNS if c in names]
        # ids as categoricals: a seed-scale trace has millions of rows but only thousands
        # of distinct ids (as Python strings they took ~5 s and ~0.5 GB more to read)
        ids = [c for c in ("task_id", "trajectory_id", "parent_trajectory_id") if c in names]
        table = pq.read_table(path, columns=cols, read_dictionary=ids)
        df = table.to_pandas(self_destruct=True)
        del table
    except Exception as exc:  # pyarrow raises many types for corrupt files
        raise RecordError(f"{path}: unreadable trace ({str(exc).splitlines()[0][:120]})") from None
    missing = {"trajectory_id", "task_id", "turn", "prompt_tokens", "output_tokens", "env_seconds"} - set(df.columns)
    if missing:
        raise RecordError(f"{path}: not a trace (missing {', '.join(sorted(missing))})")
    return df


def _trace_section(records: Sequence[RunInfo]) -> str:
    """Statistics and length CDFs of each distinct trace the runs replayed."""
    from rlsched.traces import load_trace, trace_stats

    parts: list[str] = []
    seen: dict[str, Path | None] = {}
    for rec in records:
        given = str(rec.meta.get("trace") or "")
        if given not in seen:
            seen[given] = _trace_path(rec)
    for given, path in list(seen.items())[:3]:
        name = html.escape(given or "(no trace path in meta.json)")
        if path is None:
            parts.append(f"<p class='note'>Trace <code>{name}</code>: not readable from here, so no trace statistics.</p>")
            continue
        try:
            df = _read_trace(path, load_trace)
        except RlschedError as err:
            parts.append(f"<p class='note'>Trace <code>{name}</code>: {html.escape(str(err))}</p>")
            continue
        lengths = plots.trajectory_lengths(df)
        axes = plots.plot_length_cdfs(lengths, title=f"Trace {path.name}: trajectory lengths")
        parts.append(f"<h3>Trace <code>{name}</code></h3>")
        parts.append(_img(png_bytes(axes[0].figure), f"length CDFs of {path.name}"))
        stats = trace_stats(df).reset_index()
        parts.append(fmt_table(stats, digits=3))
    if len(seen) > 3:
        parts.append(f"<p class='note'>{len(seen) - 3} more traces not shown.</p>")
    return "\n".join(parts)


HOST_META = frozenset({"wall_seconds"})  # host time a live record's meta keeps: not on the page


def _version() -> str:
    """The installed rlsched's version (from its distribution: analysis does not import the
    CLI package)."""
    from importlib import metadata

    try:
        return metadata.version("rlsched")
    except metadata.PackageNotFoundError:
        return "unknown"


def _config_section(runs: Sequence[RunInfo]) -> str:
    parts = []
    for run in runs:
        meta = {k: v for k, v in run.meta.items()
                if not k.startswith("_") and k not in ("config", "cost_model") and k not in HOST_META}
        cfg = run.meta.get("config") if isinstance(run.meta.get("config"), dict) else {}
        cost = run.meta.get("cost_model") if isinstance(run.meta.get("cost_model"), dict) else {}
        parts.append(
            f"<details><summary>{html.escape(run.name)} <span class='note'>({html.escape(run.run_dir)})</span></summary>"
            f"<div class='cols'><div><h4>Run</h4>{kv_table(meta)}</div>"
            f"<div><h4>Configuration</h4>{kv_table(cfg) if cfg else '<p class=note>none recorded</p>'}</div>"
            f"<div><h4>Cost model</h4>{kv_table(cost) if cost else '<p class=note>none recorded</p>'}</div></div></details>"
        )
    return "\n".join(parts)


def _critical_section(summary: pd.DataFrame, per_step: pd.DataFrame | None) -> str:
    """What holds each step back (:mod:`.critical`): the summary's sums per run, and every
    step's row behind a fold."""
    cols = ["policy", "steps", "sim_seconds", "steps_start_delay_s", "steps_longest_solo_s",
            "steps_tail_slowdown_s", "steps_after_rollout_s"]
    out = ["<h3>What holds each step back</h3><p class='note'>Each step, from when its batch could "
           "first roll out (the end of the step whose weights it may be generated by: the previous one "
           "on-policy, k+1 back with staleness k) to its own end: the <b>start delay</b> to its first "
           "dispatch (role switches, weight syncs), its "
           "<b>longest solo</b> (its longest trajectory alone on an engine: no schedule avoids it), the "
           "<b>tail slowdown</b> (the rest of its rollout: the last trajectories slower than alone, "
           "sharing an engine's decode) and what is left <b>after the rollout</b> (training, the "
           "optimizer step). Seconds summed over the steps; on-policy they sum to the run, with "
           "staleness k they cover it about k+1 times. The solo parts need the simulator's cost model (a live run "
           "shows –).</p>"]
    if summary["steps_tail_slowdown_s"].astype(float).notna().any():
        out.append(_img(png_bytes(plots.plot_held_back(summary).figure), "what held the steps back, per policy"))
    out.append(fmt_table(summary[cols], digits=4))
    if per_step is not None and len(per_step):
        out.append("<details><summary>Every step (table; <code>critical_path.csv</code>)</summary>"
                   + fmt_table(per_step, digits=4) + "</details>")
    return "".join(out)


def _learning_section(learning: pd.DataFrame) -> str:
    """Reward, loss, KL, staleness and clipping vs step, for the runs that recorded them."""
    parts = ["<h2>Learning</h2>",
             "<p class='note'>Per optimizer step, over the trajectories it trained: mean reward (band: mean "
             "within-group spread), token-mean loss, k3 KL to the starting weights, token staleness, the share "
             "of tokens the PPO clip or the behaviour-weight cap acted on; <code>learning.csv</code> has every "
             "column, the importance ratio's mean/min/max too.</p>"]
    rows = []
    for policy, df in learning.groupby("policy", sort=False):
        r = df.dropna(subset=["reward_mean"])
        rows.append({"policy": policy, "steps": len(df),
                     "first_reward": r["reward_mean"].iloc[0] if len(r) else float("nan"),
                     "last_reward": r["reward_mean"].iloc[-1] if len(r) else float("nan"),
                     "last5_reward": r["reward_mean"].tail(5).mean() if len(r) else float("nan"),
                     "final_kl": df["kl_to_start"].dropna().iloc[-1] if df["kl_to_start"].notna().any() else float("nan"),
                     "max_token_staleness": df["token_staleness_max"].max(),
                     "clip_fraction": df["clip_fraction"].mean(),
                     "ratio_min": df["ratio_min"].min(), "ratio_max": df["ratio_max"].max()})
    parts.append(fmt_table(pd.DataFrame(rows), digits=3))
    parts.append(_img(png_bytes(plots.plot_learning(learning)), "learning figures per step"))
    parts.append("<details><summary>Learning figures per step (table)</summary>"
                 + fmt_table(learning, digits=3) + "</details>")
    return "\n".join(parts)


def render_html(t: Tables, run_figures: dict[str, str], title: str) -> str:
    s = t.summary
    body: list[str] = [f"<h1>{html.escape(title)}</h1>"]
    body.append(  # no date or host time: the page of a replay is the same file every time
        f"<p class='note'>{len(t.runs)} run(s); made by <code>rlsched report</code> "
        f"(rlsched {html.escape(_version())}). Busy = generating or training; every share is of all "
        "GPU-time (GPUs x makespan).</p>"
    )
    warning = setup_warning([(r.path, r.meta) for r in t.runs])
    if warning:  # (also said on stderr by `rlsched report`)
        body.append(f"<p class='warn'>Note: {html.escape(warning)}.</p>")
    body.append("<h2>Summary</h2>")
    speed = ["policy", "steps", "sim_seconds", "lower_bound_seconds", "gap_to_bound_pct", "gpu_utilization",
             "idle_fraction", "steps_per_hour", "trained_tokens", "trained_tokens_per_gpu_hour"]
    quality = ["policy", "max_staleness", "lost_trajectories", "unfinished_trajectories", "dropped_trajectories",
               "wasted_tokens", "saved_tokens", "complete", "driver", "num_gpus", "events_processed"]
    body.append(fmt_table(s[speed], digits=3))
    body.append(fmt_table(s[quality], digits=3))
    body.append("<p class='note'>Times in seconds; <code>summary.csv</code> beside this page has every column.</p>")
    body.append("<h2>Where the time went</h2><ul class='story'>")
    for run in t.runs:
        name = run.name
        row = s[s["policy"] == name].iloc[0].to_dict()
        body.append(f"<li>{describe(name, row, t.breakdown[t.breakdown['policy'] == name])}</li>")
        if not run.meta.get("complete", False):
            body.append(f"<li class='warn'>{html.escape(name)}: the run is incomplete ({row['steps']} of {run.meta.get('num_steps', '?')} steps).</li>")
    body.append("</ul>")
    body.append(_img(png_bytes(plots.plot_breakdown(t.breakdown, s).figure), "GPU-time breakdown per policy"))
    bd = t.breakdown
    order = pd.MultiIndex.from_tuples(list(dict.fromkeys(zip(bd["state"], bd["cause"], strict=True))), names=["state", "cause"])
    pivot = bd.set_index(["state", "cause", "policy"])["fraction"].unstack("policy").reindex(order)[list(t.names)]
    body.append("<details><summary>Breakdown table (share of GPU-time)</summary>"
                + fmt_table(pivot.reset_index(), digits=3, percent=list(t.names)) + "</details>")
    body.append("<h2>Steps</h2>")
    body.append(_img(png_bytes(plots.plot_step_times(t.step_times).figure), "time per optimizer step"))
    body.append(_critical_section(s, t.critical))
    if t.learning is not None:
        body.append(_learning_section(t.learning))
    body.append("<h2>Per-run timelines</h2>")
    body.extend(run_figures.get(name, "") for name in t.names)
    body.append("<h2>Idle bubbles</h2><p class='note'>A bubble is a maximal stretch of one GPU's time with nothing generating or training.</p>")
    body.append(fmt_table(t.bubbles, digits=3))
    body.append("<h2>Staleness and its cost</h2>")
    body.append(_img(png_bytes(plots.plot_staleness(t.staleness).figure), "staleness histogram"))
    body.append(fmt_table(t.waste, digits=3))
    body.append("<h3>Length bias</h3><p class='note'>Mean trace length (turns) of the trajectories each "
                "step trained vs. of that step's batch; below 0: short ones were trained first.</p>")
    body.append(_img(png_bytes(plots.plot_length_bias(t.length_bias).figure), "length bias per step"))
    body.append("<details><summary>Length bias per step (table)</summary>" + fmt_table(t.length_bias, digits=3) + "</details>")
    body.append("<h2>Trace</h2>")
    body.append(_trace_section(t.runs))
    body.append("<h2>Configuration and cost model</h2>")
    body.append(_config_section(t.runs))
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{html.escape(title)}</title>"
        f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + f"\n<script>{SCRIPT}</script></body></html>\n"
    )


def write_report(run_dirs: Sequence[Path], out_dir: Path, *, title: str | None = None) -> Path:
    """Read the run records, write ``out_dir/report.html`` and the CSV tables; return the
    page's path. Any unreadable run directory is one :class:`RecordError` line.

    Every file written is a function of the records (and the trace they name): the same
    runs give the same bytes (no date, no host time)."""
    if not run_dirs:
        raise RecordError("no run directories given (expected one or more folders `rlsched compare/run` wrote)")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise RecordError(f"{out_dir}: exists and is not a directory (expected the report's output folder)")
    t, figures = collect([Path(d) for d in run_dirs], out_dir)
    return write_collected(t, figures, out_dir, title=title)


def write_collected(t: Tables, figures: dict[str, str], out_dir: Path, *, title: str | None = None) -> Path:
    """Write the page and CSVs of tables :func:`collect` made (``rlsched compare`` takes its
    ``summary.csv`` from the same tables, so each record is read once)."""
    page = render_html(t, figures, title or _default_title(t))
    csvs: dict[str, pd.DataFrame] = {
        "summary.csv": t.summary, "breakdown.csv": t.breakdown, "bubbles.csv": t.bubbles,
        "staleness.csv": t.staleness, "waste.csv": t.waste, "length_bias.csv": t.length_bias,
        "step_times.csv": t.step_times,
    }
    if t.learning is not None:
        csvs["learning.csv"] = t.learning
    if t.critical is not None:
        csvs["critical_path.csv"] = t.critical
    path = out_dir / "report.html"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, df in csvs.items():
            df.to_csv(out_dir / name, index=False)
        path.write_text(page, encoding="utf-8")
    except OSError as exc:  # e.g. --out below a file: one line, no traceback
        raise RecordError(f"{out_dir}: cannot write the report there ({exc.strerror or exc.__class__.__name__}) "
                          "(expected the report's output folder)") from None
    return path


def _default_title(t: Tables) -> str:
    if len(t.runs) == 1:
        return f"rlsched report: {t.runs[0].name}"
    return f"rlsched report: {len(t.runs)} policies"
