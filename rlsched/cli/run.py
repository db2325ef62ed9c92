"""``rlsched compare`` and ``rlsched run``: the simulator's and live backend's front door."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlsched.cluster.config import LoggingConfig, RunConfig
from rlsched.cluster.errors import ConfigError
from rlsched.config import ConfigFile, load_config

TraceOpt = Annotated[Path | None, typer.Option("--trace", help="Trace (Parquet/JSONL). Default: the shipped sample.")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="TOML config: [cluster] [run] [cost] [[policy]].")]
CostOpt = Annotated[Path | None, typer.Option("--cost", help="Cost-model file (TOML/JSON), e.g. from `rlsched calibrate`.")]
GpusOpt = Annotated[int | None, typer.Option("--gpus", help="GPU slots in the cluster.")]
TpOpt = Annotated[int | None, typer.Option("--tp", help="GPUs per inference engine.")]
StepsOpt = Annotated[int | None, typer.Option("--steps", help=(
    "Optimizer steps to run (default 4, from the config: the first batch's warm-up dominates "
    "every ratio at 4 steps; for steady state use --steps 12 --tasks-per-step 16, about as "
    "fast on the shipped trace)."))]
TasksOpt = Annotated[int | None, typer.Option("--tasks-per-step", help="Tasks drawn per step.")]
SamplesOpt = Annotated[int | None, typer.Option("--samples-per-task", help="Trajectories used per task.")]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Seed for the run.")]
CheckOpt = Annotated[bool, typer.Option("--check", help="Check invariants at run time (slower).")]
ModelOpt = Annotated[str | None, typer.Option("--model", help=(
    "Model preset (see `rlsched cost list`), e.g. qwen2.5-32b; default qwen2.5-32b on h200; "
    "'none': the flat historic cost model (no trainer floor, flat fabric)."))]
GpuOpt = Annotated[str | None, typer.Option("--gpu", help="GPU preset (see `rlsched cost list`), e.g. h200.")]


def resolve_settings(
    config: Path | None, cost: Path | None, model_name: str | None = None, gpu_name: str | None = None,
    **overrides: int | bool | None,
) -> tuple[ConfigFile, RunConfig, object]:
    """Run settings and the cost model: a preset (``--model``/``--gpu``, else the config's
    ``[cost] model``/``gpu``, else the default), then a ``--cost`` file, then ``[cost]``."""
    from rlsched.sim.presets import resolve_cost

    cfg = load_config(config) if config is not None else ConfigFile()
    run = cfg.run.with_overrides(**overrides)
    model = resolve_cost(model_name, gpu_name, cost, cfg.cost, f"{cfg.source} [cost]")
    return cfg, run, model


def resolve_trace_path(trace: Path | None, cfg: ConfigFile) -> Path:
    from rlsched.traces import sample_trace_path

    if trace is not None:
        return trace
    if cfg.trace is not None:
        base = Path(cfg.source).parent if cfg.source != "<defaults>" else Path()
        return base / cfg.trace
    return sample_trace_path()


def read_files(*paths: Path | None) -> tuple[Path, ...]:
    """The input files given (--config, --cost): an --out --force must not delete them."""
    return tuple(p for p in paths if p is not None)


def register(app: typer.Typer) -> None:
    app.command("compare")(compare_cmd)
    app.command("run")(run_cmd)


def compare_cmd(
    out: Annotated[Path, typer.Option("--out", help="Output directory (summary.csv, runs/, report.html).")],
    trace: TraceOpt = None,
    policies: Annotated[list[str] | None, typer.Option("--policies", help="Comma-separated policy names; repeatable.")] = None,
    policy: Annotated[list[str] | None, typer.Option("--policy", help="Policy spec NAME[:key=value,...]; repeatable.")] = None,
    config: ConfigOpt = None,
    cost: CostOpt = None,
    model_preset: ModelOpt = None,
    gpu_preset: GpuOpt = None,
    gpus: GpusOpt = None,
    tp: TpOpt = None,
    steps: StepsOpt = None,
    tasks_per_step: TasksOpt = None,
    samples_per_task: SamplesOpt = None,
    seed: SeedOpt = None,
    check: CheckOpt = False,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty --out directory.")] = False,
    no_report: Annotated[bool, typer.Option("--no-report", help="Skip report.html.")] = False,
    open_report: Annotated[bool, typer.Option("--open", help="Open report.html in a browser.")] = False,
) -> None:
    """Replay one trace under several policies; write summary.csv, run records and a report.

    A policy that fails after others finished keeps theirs: they are written (and shown),
    then one error line names the failed policy and what was kept."""
    from rlsched.compare import ComparePlan, RunFailed, compare, resolve_specs
    from rlsched.ui import console_err, print_summary, step_progress

    cfg, run, model = resolve_settings(
        config, cost, model_preset, gpu_preset, gpus=gpus, tp=tp, steps=steps, tasks_per_step=tasks_per_step,
        samples_per_task=samples_per_task, seed=seed, check=check or None,
    )
    specs = resolve_specs(policy or [], policies, cfg.policies)
    plan = ComparePlan(resolve_trace_path(trace, cfg), specs, run, model,  # type: ignore[arg-type]
                       read_files(config, cost))
    try:
        with step_progress(specs, run.steps) as progress:
            summary = compare(plan, out, force=force, progress=progress, report=not no_report)
    except RunFailed as failed:  # (the finished runs' table, then main's one error line)
        if len(failed.summary):  # (none when their summary could not be written either)
            print_summary(failed.summary, out)
        raise
    print_summary(summary, out)
    console_err().print(f"wrote {out / 'summary.csv'}")
    if not no_report:
        report = out / "report.html"
        console_err().print(f"report: {report}")
        if open_report:
            import webbrowser

            webbrowser.open(report.absolute().as_uri())


def run_cmd(
    out: Annotated[Path, typer.Option("--out", help="Output directory (summary.csv, runs/, report.html), with or without --live.")],
    policy_given: Annotated[list[str] | None, typer.Option("--policy", help="Policy spec NAME[:key=value,...]; default: the config's first [[policy]].")] = None,
    live: Annotated[bool, typer.Option("--live", help="Run on the live backend (Ray + vLLM + Megatron-core).")] = False,
    trace: TraceOpt = None,
    config: ConfigOpt = None,
    cost: CostOpt = None,
    model_preset: ModelOpt = None,
    gpu_preset: GpuOpt = None,
    gpus: GpusOpt = None,
    tp: TpOpt = None,
    steps: StepsOpt = None,
    tasks_per_step: TasksOpt = None,
    samples_per_task: SamplesOpt = None,
    seed: SeedOpt = None,
    check: CheckOpt = False,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty --out directory.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Live only: continue the run in --out from its last optimizer step.")] = False,
    logger: Annotated[str | None, typer.Option("--logger", help="Live only: stream metrics to tensorboard, wandb (offline) or none; NAME[,NAME]. Default: the config's [logging].")] = None,
) -> None:
    """Run one policy: in the simulator on a trace, or with --live on real engines.

    Both write the same layout: OUT/summary.csv, the run record in OUT/runs/00-SPEC/ and
    OUT/report.html (a live run that stopped before its last step gets no report, like an
    interrupted compare)."""
    from rlsched.policies import make_policy, make_policy_and_spec

    # (a plain option: `--policy a --policy b` silently ran b alone, though compare's
    # --policy repeats)
    if policy_given and len(policy_given) > 1:
        raise ConfigError(f"run takes one --policy (got {len(policy_given)}: {', '.join(policy_given)}); "
                          "to run several, use rlsched compare --policy A --policy B")
    policy = policy_given[0] if policy_given else None
    if policy is None:
        policies = load_config(config).policies if config is not None else ()
        if not policies and not (live and resume):  # a resume can take the run's own policy
            raise ConfigError("run: give --policy NAME[:key=value,...] or a --config with a [[policy]] entry")
        policy = policies[0] if policies else None
    if policy is not None:
        make_policy(policy)  # one-line error for a bad spec before anything starts
    if live:
        cfg = load_config(config) if config is not None else ConfigFile()
        if trace is not None:
            raise ConfigError("--trace is for the simulator; a --live run records its own trace")
        if model_preset is not None or gpu_preset is not None:
            raise ConfigError("--model/--gpu choose the simulator's cost model; a --live run measures "
                              "its own hardware (drop them, or use rlsched calibrate)")
        logging = LoggingConfig.parse(logger) if logger is not None else (cfg.logging if config is not None else None)
        try:
            from rlsched.real.run import run_live
        except ImportError as exc:
            raise ConfigError(
                f"the live backend is not available ({exc}); install it with .ci/install-live"
            ) from None
        if resume:
            run_dir = find_live_run(out)
        else:  # OUT is made (or, with --force, emptied) only once run_live has checked the config
            if out.exists() and not out.is_dir():
                raise ConfigError(f"--out {out}: exists and is not a directory")
            from rlsched.compare import run_dir_name

            run_dir = out / "runs" / run_dir_name(policy or "policy", 0)
        try:
            if resume and config is None:  # continue with the run's own settings (its checkpoint has them)
                if gpus is not None or tp is not None or seed is not None:
                    raise ConfigError("--resume without --config continues with the run's own settings; drop --gpus/--tp/--seed")
                run_live(policy, make=make_policy_and_spec, steps=steps, out_dir=run_dir,
                         config={"run": None, "live": None, "resume": True, "logging": logging})
            else:
                run = cfg.run.with_overrides(steps=steps, seed=seed)
                # --gpus/--tp name the live host, so they win over [live] gpus/tp as well as [cluster]
                # (through the [live] table: a planned tp=4 need not divide the host's 2 slots)
                live_table = {**cfg.live, **{k: v for k, v in (("gpus", gpus), ("tp", tp)) if v is not None}}
                run_live(policy, make=make_policy_and_spec, steps=run.steps, out_dir=run_dir,
                         config={"run": run, "live": live_table, "force": force, "resume": resume,
                                 "logging": logging,
                                 "prepare": lambda: prepare_live_out(out, force=force, inputs=read_files(config))},
                         seed=run.seed)
        except BaseException:
            if not resume:
                _remove_if_empty(out)
            raise
        finish_live(out, run_dir)
        return
    if resume:
        raise ConfigError("--resume applies to --live runs only")
    if logger is not None:
        raise ConfigError("--logger applies to --live runs only (a simulated run has its report)")
    from rlsched.compare import ComparePlan, compare
    from rlsched.ui import print_summary, step_progress

    cfg, run, model = resolve_settings(
        config, cost, model_preset, gpu_preset, gpus=gpus, tp=tp, steps=steps, tasks_per_step=tasks_per_step,
        samples_per_task=samples_per_task, seed=seed, check=check or None,
    )
    plan = ComparePlan(resolve_trace_path(trace, cfg), (policy,), run, model,  # type: ignore[arg-type]
                       read_files(config, cost))
    with step_progress((policy,), run.steps) as progress:
        summary = compare(plan, out, force=force, progress=progress)
    print_summary(summary, out)
    typer.echo(f"run written to {out}")


# ----------------------------------------------------------------------------- live layout
def prepare_live_out(out: Path, *, force: bool, inputs: tuple[Path, ...] = ()) -> None:
    """``--out`` for a fresh live run: absent, empty, or replaced with --force (as compare)."""
    import shutil

    from rlsched.compare import check_out_dir

    check_out_dir(out, force, inputs)
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise ConfigError(f"--out {out}: directory is not empty (use --force to replace it, "
                              "or --resume to continue a live run stopped after a step)")
        shutil.rmtree(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot create it ({exc.strerror or exc.__class__.__name__})") from None


def find_live_run(out: Path) -> Path:
    """The run directory a ``--resume --out OUT`` continues: ``OUT/runs/NN-SPEC`` (the layout
    ``run`` writes with and without --live), or ``OUT`` itself for a live run recorded before
    that layout (its record and checkpoint at OUT: it resumes in place). A folder that is
    neither is left to the checkpoint's own one-line refusal."""
    if (out / "checkpoint" / "manifest.json").is_file():
        return out  # the old layout
    runs = out / "runs"
    found = sorted(p for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []
    live = [p for p in found if (p / "checkpoint" / "manifest.json").is_file()]
    if len(live) > 1:
        raise ConfigError(f"--resume {out}: {len(live)} live runs under runs/ ({live[0].name}, {live[1].name}); "
                          "a run --live output holds one")
    if live:
        return live[0]
    return found[0] if len(found) == 1 else out  # the checkpoint check names what is missing


def finish_live(out: Path, run_dir: Path) -> None:
    """What ``compare`` writes around a run record: summary.csv, then the report (only for a
    complete run). A run resumed in the old layout (record at OUT) gets neither: they would
    land among its record's files."""
    from rlsched.cluster.record import read_run
    from rlsched.ui import console_err

    if run_dir == out:
        typer.echo(f"live run written to {out} (the layout before summary.csv/runs/; "
                   f"make a report with: rlsched report {out} --out DIR)", err=True)
        return
    import time

    import pandas as pd

    from rlsched.compare import TIMING_COLUMNS

    record = read_run(run_dir)
    spec = record.meta.get("spec_as_given") or record.meta.get("policy")
    timing = [("live", spec, f"runs/{run_dir.name}", float(record.meta.get("wall_seconds", float("nan"))))]
    t0 = time.perf_counter()
    row = live_summary(out, [run_dir]).iloc[0]
    # one line, not ui.print_summary's table: that one is titled "(simulated)"
    typer.echo(f"{row['policy']}: {int(row['steps'])} steps in {row['sim_seconds']:,.1f}s live, "
               f"gpu_utilization {row['gpu_utilization']:.3f}, trained_tokens {int(row['trained_tokens']):,}, "
               f"max_staleness {int(row['max_staleness'])}, lost_trajectories {int(row['lost_trajectories'])}")
    if record.meta.get("complete"):
        from rlsched.analysis.report import write_report

        write_report([run_dir], out, title=f"rlsched run --live: {spec}")
        timing.append(("report", "", "", time.perf_counter() - t0))
        console_err().print(f"report: {out / 'report.html'}")
    else:
        timing.append(("summary", "", "", time.perf_counter() - t0))
        console_err().print(f"the run stopped before its last step (complete=false): no report "
                            f"(make one with: rlsched report {run_dir} --out DIR)")
    # the host's seconds, as compare writes them (the live run's own: part "live")
    pd.DataFrame(timing, columns=list(TIMING_COLUMNS)).to_csv(out / "timing.csv", index=False)
    typer.echo(f"live run written to {out}")


def live_summary(out: Path, run_dirs: list[Path]):  # -> pd.DataFrame
    """OUT/summary.csv for live runs: compare's rows and columns (one code path,
    ``rlsched.compare.summary_rows``), the policy as given and the run's folder under runs/."""
    from rlsched.cluster.record import read_run
    from rlsched.compare import summary_rows

    specs = []
    for rd in run_dirs:
        meta = read_run(rd, tables=()).meta
        specs.append(meta.get("spec_as_given") or meta.get("policy"))
    summary = summary_rows(specs, run_dirs)
    summary.to_csv(out / "summary.csv", index=False)
    return summary


def _remove_if_empty(out: Path) -> None:
    """After a live run that left nothing (it failed before it started): no empty folders."""
    import contextlib

    for d in (out / "runs", out):
        with contextlib.suppress(OSError):
            d.rmdir()
