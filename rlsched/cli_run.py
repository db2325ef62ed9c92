"""``rlsched compare`` and ``rlsched run``: the simulator's and live backend's front door."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlsched.cluster.config import ConfigFile, RunConfig, load_config
from rlsched.cluster.errors import ConfigError

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


def resolve_settings(
    config: Path | None, cost: Path | None, **overrides: int | bool | None
) -> tuple[ConfigFile, RunConfig, object]:
    from rlsched.sim.cost import CostModel

    cfg = load_config(config) if config is not None else ConfigFile()
    run = cfg.run.with_overrides(**overrides)
    model = CostModel.from_file(cost) if cost is not None else CostModel()
    if cfg.cost:
        model = model.with_overrides(cfg.cost, source=f"{cfg.source} [cost]")
    return cfg, run, model


def resolve_trace_path(trace: Path | None, cfg: ConfigFile) -> Path:
    from rlsched.traces import sample_trace_path

    if trace is not None:
        return trace
    if cfg.trace is not None:
        base = Path(cfg.source).parent if cfg.source != "<defaults>" else Path()
        return base / cfg.trace
    return sample_trace_path()


def register(app: typer.Typer) -> None:
    app.command("compare")(compare_cmd)
    app.command("run")(run_cmd)


def compare_cmd(
    out: Annotated[Path, typer.Option("--out", help="Output directory (summary.csv, runs/, report.html).")],
    trace: TraceOpt = None,
    policies: Annotated[str | None, typer.Option("--policies", help="Comma-separated policy names.")] = None,
    policy: Annotated[list[str] | None, typer.Option("--policy", help="Policy spec NAME[:key=value,...]; repeatable.")] = None,
    config: ConfigOpt = None,
    cost: CostOpt = None,
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
    """Replay one trace under several policies; write summary.csv, run records and a report."""
    from rlsched.compare import ComparePlan, compare, resolve_specs
    from rlsched.ui import console_err, print_summary, step_progress

    cfg, run, model = resolve_settings(
        config, cost, gpus=gpus, tp=tp, steps=steps, tasks_per_step=tasks_per_step,
        samples_per_task=samples_per_task, seed=seed, check=check or None,
    )
    specs = resolve_specs(policy or [], policies, cfg.policies)
    plan = ComparePlan(resolve_trace_path(trace, cfg), specs, run, model)  # type: ignore[arg-type]
    with step_progress(specs, run.steps) as progress:
        summary = compare(plan, out, force=force, progress=progress, report=not no_report)
    print_summary(summary)
    console_err().print(f"wrote {out / 'summary.csv'}")
    if not no_report:
        report = out / "report.html"
        console_err().print(f"report: {report}")
        if open_report:
            import webbrowser

            webbrowser.open(report.absolute().as_uri())


def run_cmd(
    out: Annotated[Path, typer.Option("--out", help="Run directory to write.")],
    policy: Annotated[str | None, typer.Option("--policy", help="Policy spec NAME[:key=value,...]; default: the config's first [[policy]].")] = None,
    live: Annotated[bool, typer.Option("--live", help="Run on the live backend (Ray + vLLM + Megatron-core).")] = False,
    trace: TraceOpt = None,
    config: ConfigOpt = None,
    cost: CostOpt = None,
    gpus: GpusOpt = None,
    tp: TpOpt = None,
    steps: StepsOpt = None,
    tasks_per_step: TasksOpt = None,
    samples_per_task: SamplesOpt = None,
    seed: SeedOpt = None,
    check: CheckOpt = False,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty --out directory.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Live only: continue the run in --out from its last optimizer step.")] = False,
) -> None:
    """Run one policy: in the simulator on a trace, or with --live on real engines."""
    from rlsched.policies import make_policy, make_policy_and_spec

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
        try:
            from rlsched.real.driver import run_live
        except ImportError as exc:
            raise ConfigError(
                f"the live backend is not available ({exc}); install it with .ci/install-live"
            ) from None
        if resume and config is None:  # continue with the run's own settings (its checkpoint has them)
            if gpus is not None or tp is not None or seed is not None:
                raise ConfigError("--resume without --config continues with the run's own settings; drop --gpus/--tp/--seed")
            path = run_live(policy, make=make_policy_and_spec, steps=steps, out_dir=out,
                            config={"run": None, "live": None, "resume": True})
            typer.echo(f"live run written to {path}")
            return
        run = cfg.run.with_overrides(steps=steps, seed=seed)
        # --gpus/--tp name the live host, so they win over [live] gpus/tp as well as [cluster]
        # (through the [live] table: a planned tp=4 need not divide the host's 2 slots)
        live_table = {**cfg.live, **{k: v for k, v in (("gpus", gpus), ("tp", tp)) if v is not None}}
        path = run_live(policy, make=make_policy_and_spec, steps=run.steps, out_dir=out,
                        config={"run": run, "live": live_table, "force": force, "resume": resume}, seed=run.seed)
        typer.echo(f"live run written to {path}")
        return
    if resume:
        raise ConfigError("--resume applies to --live runs only")
    from rlsched.compare import ComparePlan, compare
    from rlsched.ui import print_summary, step_progress

    cfg, run, model = resolve_settings(
        config, cost, gpus=gpus, tp=tp, steps=steps, tasks_per_step=tasks_per_step,
        samples_per_task=samples_per_task, seed=seed, check=check or None,
    )
    plan = ComparePlan(resolve_trace_path(trace, cfg), (policy,), run, model)  # type: ignore[arg-type]
    with step_progress((policy,), run.steps) as progress:
        summary = compare(plan, out, force=force, progress=progress)
    print_summary(summary)
    typer.echo(f"run written to {out}")
