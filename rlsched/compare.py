"""``rlsched compare``: every policy replays the same tasks on the same cost model.

Everything a user can get wrong (trace, config, policy specs, cost file, output folder)
is checked before the first simulation starts -- each spec's first decision included, made
on the run's own starting cluster (:func:`preflight`), so a spec that cannot run there is
refused before the policies ahead of it ran -- and results are written to a temporary
sibling folder that is renamed into place only when complete -- so a failed compare
never leaves a half-written output directory.

A policy that fails during its run after others finished does not cost their runs, which
may have taken hours: the finished runs are published with their ``summary.csv`` (and the
report), the failed run's half-written record is dropped, the policies after it are not
run, and :class:`RunFailed` says which failed, why, and what was kept.

Outputs are a function of the inputs: replaying the same compare gives the same bytes
in every file (``summary.csv``, the run records, the report) except ``timing.csv``, which
holds the host's wall-clock seconds of each simulation and of the report (one row each:
``part, policy, run_dir, wall_seconds``).

Ctrl-C is the exception, because a seed-scale replay runs for minutes and what it has
simulated is worth keeping: the simulator stops where it is, and compare stops there too
(the policies not yet run are not started). The runs finished so far and the interrupted
one, its record marked ``complete: false``, are published with their ``summary.csv`` rows
(column ``complete``); the report is skipped, and :class:`Interrupted` says what was kept.
A Ctrl-C while the report of finished runs is written keeps the runs the same way.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import ConfigError, Interrupted, PolicyError, RlschedError
from rlsched.policies import canonical_spec, make_policy
from rlsched.policies.plugins import PluginError
from rlsched.sim.cost import CostModel
from rlsched.sim.driver import SimDriver
from rlsched.sim.run import simulate
from rlsched.sim.workload import Batches, Workload, replay_workload
from rlsched.traces.digest import trace_location, trace_meta

SUMMARY_COLUMNS = (
    "policy", "steps", "sim_seconds", "trained_tokens", "gpu_utilization", "max_staleness",
    "lost_trajectories", "lower_bound_seconds",
)

TIMING_COLUMNS = ("part", "policy", "run_dir", "wall_seconds")
StepProgress = Callable[[str, int, int, float], None]  # (policy, steps done, steps, sim time)


@dataclass(frozen=True)
class ComparePlan:
    trace_path: Path
    specs: tuple[str, ...]
    config: RunConfig
    cost: CostModel
    #: Other files the command read (its --config, --cost): like the trace, never deleted by
    #: an --out --force that holds them (``--config OUT/recommended.toml --out OUT --force``
    #: deleted the config it had just read).
    inputs: tuple[Path, ...] = ()


class RunFailed(RlschedError):
    """A policy's run failed after earlier ones finished, and those were published.

    An error of its own so that the one line says what was kept as well as what failed;
    ``__cause__`` is the run's own error, ``spec`` the failed policy as given and
    ``summary`` the finished runs' summary.csv rows (the command line still shows them)."""

    def __init__(self, message: str, spec: str, summary: pd.DataFrame) -> None:
        super().__init__(message)
        self.spec = spec
        self.summary = summary


def run_dir_name(spec: str, index: int) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.=-]+", "_", spec).strip("_") or "policy"
    return f"{index:02d}-{safe}"[:120]


def check_out_dir(out: Path, force: bool, inputs: Sequence[Path | str] = ()) -> None:
    """Refuse an ``--out`` that ``--force`` could not replace safely: a symbolic link (replacing
    it would remove the link, or the folder it points to, and neither is what was asked), the
    current directory or one holding it (``--out . --force`` removed everything in the folder
    the user stood in, then failed), or one that holds an input of this command (the trace
    or run being read would be deleted with it)."""
    if out.is_symlink():
        raise ConfigError(f"--out {out}: is a symbolic link (to {os.readlink(out)}); "
                          "give the directory itself or a new folder")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    if not (force and out.is_dir() and any(out.iterdir())):
        return
    real = Path(os.path.realpath(out))
    here = Path(os.path.realpath(Path.cwd()))
    if real == here or real in here.parents:
        raise ConfigError(f"--out {out}: is the current directory or holds it, which --force would "
                          "delete with everything in it; give a new or dedicated folder")
    for given in inputs:
        path = Path(os.path.realpath(given))
        if path == real or real in path.parents:
            raise ConfigError(f"--out {out}: holds the input {given}, which --force would delete; "
                              "give another folder")


def prepare_out_dir(out: Path, force: bool, inputs: Sequence[Path | str] = ()) -> Path:
    """Validate the destination and return a fresh temporary sibling to write into."""
    check_out_dir(out, force, inputs)
    if out.exists() and any(out.iterdir()) and not force:
        raise ConfigError(f"--out {out}: directory is not empty (use --force to replace it)")
    target = Path(os.path.abspath(out))  # (lexical: `--out .` names the folder, not "")
    parent = target.parent
    for above in (parent, *parent.parents):
        if above.exists():
            if not above.is_dir():
                raise ConfigError(f"--out {out}: {above} is a file, not a directory")
            break
    try:
        parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=parent))
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot create it ({exc.strerror or exc.__class__.__name__})") from None


def publish(tmp: Path, out: Path) -> None:
    """``tmp`` becomes ``out``. A folder already there is moved aside first and removed only
    once the new one is in place, so a failure between the two loses neither."""
    if not out.exists():
        tmp.rename(out)
        return
    name = Path(os.path.abspath(out)).name
    old = Path(tempfile.mkdtemp(prefix=f".{name}.old-", dir=tmp.parent))
    old.rmdir()
    try:
        out.rename(old)
    except OSError as exc:  # (an immutable or busy --out: the new results were then deleted)
        kept = Path(tempfile.mkdtemp(prefix=f"{name}.new-", dir=tmp.parent))
        kept.rmdir()
        tmp.rename(kept)  # (out of the callers' clean-up of tmp, under a name a user sees)
        raise ConfigError(f"--out {out}: cannot replace it ({exc.strerror or exc.__class__.__name__}); "
                          f"the new output is in {kept}") from None
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def compare(
    plan: ComparePlan,
    out: Path,
    *,
    force: bool = False,
    progress: StepProgress | None = None,
    report: bool = True,
) -> pd.DataFrame:
    """Run every policy of ``plan``; write run records, summary.csv and the report.

    Raises :class:`Interrupted` after publishing what was simulated when Ctrl-C stopped a
    run (see the module docstring), ``KeyboardInterrupt`` when nothing was kept;
    :class:`RunFailed` after publishing the finished runs when a later policy failed (the
    first one's error as it is: nothing was kept)."""
    policies = [make_policy(s) for s in plan.specs]  # fail on a bad spec before any work
    cfg = plan.config
    workload, batches = replay_workload(plan.trace_path, cfg.steps, cfg.tasks_per_step, cfg.samples_per_task)
    # the bytes replayed, once for every run (`rlsched report` tells a trace replaced in place)
    trace = {**trace_location(plan.trace_path), **trace_meta(plan.trace_path)}
    preflight(plan, workload, batches)
    tmp = prepare_out_dir(out, force, inputs=(plan.trace_path, *plan.inputs))
    timing: list[tuple[str, str, str, float]] = []  # (part, policy, run_dir, wall seconds)
    unwritten: BaseException | None = None  # writing the results failed after a policy had
    try:
        run_dirs: list[Path] = []
        stopped: tuple[int, str] | None = None  # (index of the policy stopped, what happened)
        failed: tuple[int, Exception] | None = None  # (index of the policy that failed, its error)
        for i, policy in enumerate(policies):
            spec = canonical_spec(policy)
            rd = tmp / "runs" / run_dir_name(plan.specs[i], i)
            cb = None
            if progress is not None:
                def cb(done: int, total: int, now: float, _s: str = plan.specs[i]) -> None:
                    progress(_s, done, total, now)
            t0 = time.perf_counter()
            try:
                outcome = simulate(
                    workload, batches, policy, plan.config, plan.cost, out_dir=rd, spec=spec,
                    meta={**trace, "spec_as_given": plan.specs[i]},
                    progress=cb,
                )
            except KeyboardInterrupt:  # after the event loop (bound, record): no usable record
                shutil.rmtree(rd, ignore_errors=True)
                stopped = (i, f"{plan.specs[i]} was stopped while its run record was being written")
                break
            except Exception as exc:
                if not run_dirs:
                    raise  # (nothing finished to keep: the error as it is, no output)
                # its record has no meta.json (written last), so it would not count as a run
                # (cluster.record.runs_in); its tables are half written: dropped, not kept
                shutil.rmtree(rd, ignore_errors=True)
                failed = (i, exc)
                break
            run_dirs.append(rd)
            timing.append(("simulate", plan.specs[i], _rel_run(rd, tmp), time.perf_counter() - t0))
            r = outcome.result
            if not r.complete:
                stopped = (i, f"{plan.specs[i]} stopped at step {r.state.version}/{len(batches)} "
                              f"(simulated t={r.makespan:,.0f}s)")
                break
        if stopped is not None and not run_dirs:
            raise KeyboardInterrupt
        # (every run kept is complete unless stopped: a failed one is not kept)
        try:
            summary, reported = _write_summary(plan, run_dirs, tmp, report and stopped is None, timing)
            pd.DataFrame(timing, columns=list(TIMING_COLUMNS)).to_csv(tmp / "timing.csv", index=False)
            publish(tmp, out)
        except BaseException as exc:
            if failed is None:
                raise
            # (a policy failed first: its error must not be lost to this one, which
            # propagating from here would have been the only error the user saw)
            shutil.rmtree(tmp, ignore_errors=True)
            unwritten = exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if unwritten is not None and failed is not None:  # (raised here, outside any handler)
        _raise_failed_unwritten(plan, failed, len(run_dirs), report and stopped is None, unwritten)
    make_one = f"no report (make one with: rlsched report {out}/runs/* --out DIR)"
    if stopped is not None:
        not_run = plan.specs[stopped[0] + 1:]
        raise Interrupted(
            f"{stopped[1]}; wrote {len(run_dirs)} run record(s) and summary.csv to {out} "
            f"(incomplete runs have complete=False)"
            + (f"; not run: {', '.join(not_run)}" if not_run else "")
            + f"; {make_one}"
        )
    if failed is not None:
        _raise_failed(plan, out, failed, summary, reported)
    if report and not reported:
        raise Interrupted(f"stopped while the report was being written; wrote {len(run_dirs)} run "
                          f"record(s) and summary.csv to {out}; {make_one}")
    return summary


def _write_summary(plan: ComparePlan, run_dirs: Sequence[Path], tmp: Path, report: bool,
                   timing: list[tuple[str, str, str, float]]) -> tuple[pd.DataFrame, bool]:
    """Write summary.csv into ``tmp``, with the report when ``report``; return the summary
    and whether the report was written. A Ctrl-C while the report is made drops what of it
    was written and writes summary.csv alone: the runs are worth keeping without it."""
    t0 = time.perf_counter()
    if report:
        from rlsched.analysis.report import collect, write_collected

        before = set(tmp.iterdir())
        try:
            # each record's intervals are read once, for the summary and the report alike
            tables, figures = collect(run_dirs, tmp)
            summary = _ordered(tables.summary.assign(policy=list(plan.specs[: len(run_dirs)])))
            # (the report writes summary.csv with its other tables: these rows, once)
            write_collected(replace(tables, summary=summary), figures, tmp,
                            title=f"rlsched compare: {plan.trace_path.name}")
            timing.append(("report", "", "", time.perf_counter() - t0))
            return summary, True
        except KeyboardInterrupt:
            for part in set(tmp.iterdir()) - before:  # (the report's files: beside runs/)
                if part.is_dir():
                    shutil.rmtree(part)
                else:
                    part.unlink()
            t0 = time.perf_counter()
    summary = _summary(plan, run_dirs)
    summary.to_csv(tmp / "summary.csv", index=False)
    timing.append(("summary", "", "", time.perf_counter() - t0))
    return summary, False


def _raise_failed(plan: ComparePlan, out: Path, failed: tuple[int, Exception], summary: pd.DataFrame,
                  report: bool) -> None:
    """The end of a compare whose policy ``failed`` after others finished (published to
    ``out``): one line for a user's error (and running out of memory), which names the
    failed policy, its error and what was kept; a bug's own exception, with the same
    words as a note, since its traceback is what a bug report needs."""
    i, exc = failed
    n = len(summary)
    kept = (f"wrote {out / 'summary.csv'} with the {n} run{'s' if n != 1 else ''} that finished "
            f"({', '.join(plan.specs[:n])})" + (" and report.html" if report else ""))
    not_run = plan.specs[i + 1:]
    tail = f"; not run: {', '.join(not_run)}" if not_run else ""
    if isinstance(exc, RlschedError | MemoryError):
        reason = str(exc) if isinstance(exc, RlschedError) else "out of memory"
        raise RunFailed(f"policy {plan.specs[i]} failed: {reason}; {kept}{tail}", plan.specs[i],
                        summary) from exc
    exc.add_note(f"rlsched compare: policy {plan.specs[i]} failed; {kept}{tail}")
    raise exc


def _raise_failed_unwritten(plan: ComparePlan, failed: tuple[int, Exception], finished: int, report: bool,
                            unwritten: BaseException) -> None:
    """The end of a compare whose policy ``failed`` after others finished, and whose
    results of those could then not be written either (``unwritten``: a full disk, an
    ``--out`` that cannot be replaced, a Ctrl-C, a bug in the report). Both are said, the
    policy's error first: it was the user's first problem, and the write's error alone
    (all the user saw before) hid it.

    A user's error (or running out of memory) on both sides is one :class:`RunFailed`
    line; a Ctrl-C is :class:`Interrupted` with the same words; a bug on either side is
    that bug's own exception with the words as a note, the policy's bug first (its
    traceback is what a bug report needs)."""
    i, exc = failed
    spec = plan.specs[i]
    results = "summary.csv" + (" and the report" if report else "")
    done = f"{finished} run{'s' if finished != 1 else ''} that finished ({', '.join(plan.specs[:finished])})"
    not_run = plan.specs[i + 1:]
    tail = f"; not run: {', '.join(not_run)}" if not_run else ""
    then = f"then writing {results} of the {done} failed too: {_one_line(unwritten)}{tail}"
    if not isinstance(exc, RlschedError | MemoryError):  # the policy's run hit a bug
        exc.add_note(f"rlsched compare: policy {spec} failed; {then}")
        raise exc
    reason = str(exc) if isinstance(exc, RlschedError) else "out of memory"
    message = f"policy {spec} failed: {reason}; {then}"
    if isinstance(unwritten, KeyboardInterrupt):
        raise Interrupted(message) from exc
    if isinstance(unwritten, RlschedError | OSError | MemoryError):
        raise RunFailed(message, spec, pd.DataFrame()) from exc
    unwritten.add_note(f"rlsched compare: policy {spec} had failed first: {reason}; {then}")
    raise unwritten


def _one_line(exc: BaseException) -> str:
    """What went wrong, in words for one line (an ``OSError`` as ``strerror (file)``)."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    if isinstance(exc, MemoryError):
        return "out of memory"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f" ({exc.filename})" if exc.filename else "")
    text = str(exc).strip().splitlines()
    if isinstance(exc, RlschedError) and text:
        return text[0]
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def preflight(plan: ComparePlan, workload: Workload, batches: Batches) -> None:
    """Each spec's first decision, made on the run's own starting cluster before any run
    starts: a spec that cannot run there (async's fixed split, which cannot hold the
    trainer's memory floor on a small cluster, raises at ``RunStarted``) is refused in one
    line naming it -- not after the policies ahead of it ran for hours.

    The check is the run's own start, not a copy of what the policies compute
    (:meth:`~rlsched.sim.driver.SimDriver.start`: the same driver setup, without a record,
    then ``reset`` and ``RunStarted``, its commands legality-checked and applied; no
    simulated time passes). An error of the setup itself (a cluster below the trainer's
    floor) is no spec's: it is raised as it is."""
    for spec in plan.specs:
        driver = SimDriver(workload, batches, make_policy(spec), plan.config, plan.cost)
        try:
            driver.start()
        except PluginError:
            raise  # (a defect of the plugin's code, not of these settings: its own line)
        except RlschedError as exc:
            raise PolicyError(f"policy {spec} cannot run with these settings: {exc} "
                              "(checked before any run; nothing was run)") from None


def _rel_run(rd: Path, base: Path) -> str:
    return rd.relative_to(base).as_posix()


def _summary(plan: ComparePlan, run_dirs: Sequence[Path]) -> pd.DataFrame:
    return summary_rows(plan.specs, run_dirs)


def summary_rows(specs: Sequence[str], run_dirs: Sequence[Path]) -> pd.DataFrame:
    """summary.csv's rows for run records under ``OUT/runs/`` (``policy`` = the spec as
    given, ``run_dir`` = ``runs/NAME``), without a report: each record's intervals are
    summed in one pass (only the per-state seconds; its events are not read). For any
    driver's records: the live ``rlsched run`` writes its summary.csv with it too."""
    from rlsched.analysis.load import check_record, empty_intervals
    from rlsched.analysis.metrics import summarize
    from rlsched.analysis.stream import summarize_intervals
    from rlsched.cluster.record import RunRecord, read_run

    rows = []
    for i, rd in enumerate(run_dirs):
        head = read_run(rd, tables=("trajectories", "steps"))
        rec = RunRecord(head.path, head.meta, head.events, empty_intervals(), head.trajectories, head.steps)
        check_record(rec)  # meta fields, before they are used
        streamed = summarize_intervals(
            rd / "intervals.parquet", int(rec.meta["num_gpus"]), float(rec.meta["makespan_seconds"]), full=False,
        )
        row = summarize(rec, streamed)
        row["policy"] = specs[i]
        row["run_dir"] = str(Path("runs") / rd.name)
        rows.append(row)
    return _ordered(pd.DataFrame(rows))


def _ordered(summary: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in SUMMARY_COLUMNS if c in summary.columns]
    return summary[cols + [c for c in summary.columns if c not in cols]]


def resolve_specs(policy: Sequence[str], policies: str | Sequence[str] | None,
                  from_config: Sequence[str]) -> tuple[str, ...]:
    """``--policy`` (repeatable specs) + ``--policies a,b`` (plain names; repeatable too, as
    ``--policy`` is: a second ``--policies`` silently replaced the first) + config entries."""
    specs = list(policy)
    lists = [policies] if isinstance(policies, str) else list(policies or ())
    for given in lists:  # (an empty --policies is a mistake, not "the defaults")
        for name in given.split(","):
            name = name.strip()
            if not name:
                raise ConfigError(f"--policies {given!r}: empty name in the list")
            if ":" in name or "=" in name:
                raise ConfigError(
                    f"--policies takes plain names; use --policy '{name}' for a spec with parameters"
                )
            specs.append(name)
    if not specs:
        specs = list(from_config)
    if not specs:
        specs = ["colocated", "async"]
    # (two runs of one spec are the same deterministic replay; summary.csv had two rows of
    # one name and the report, which tells them apart as 'NAME #1'/'NAME #2', then failed
    # with an IndexError looking up its own names in compare's summary)
    seen: set[str] = set()
    for spec in specs:
        key = spec.strip()
        if key in seen:
            raise ConfigError(f"policy {key!r} is given twice: each spec runs once (a replay is "
                              "deterministic, a second run repeats the first); drop the repeat")
        seen.add(key)
    return tuple(specs)
