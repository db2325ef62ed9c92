"""``rlsched calibrate`` and ``rlsched fidelity``: fit the simulator to the live backend,
then check the simulator against a live run.

``calibrate`` measures the live components of a run config and writes a cost-model file;
``fidelity`` replays a live run's recorded trace in the simulator under the same policy,
config and cost model, and writes the step-by-step comparison and a report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlsched.cluster.errors import ConfigError


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate_cmd)
    app.command("fidelity")(fidelity_cmd)


def calibrate_cmd(
    out: Annotated[Path, typer.Option("--out", help="Cost-model file to write (TOML), e.g. cost.toml.")],
    config: Annotated[Path | None, typer.Option("--config", help="The live run config to calibrate ([cluster], [live]).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed (tiny model, prompts).")] = 0,
    quick: Annotated[bool, typer.Option("--quick", help="Fewer repeats and shapes (about half the time; tests).")] = False,
    from_measurements: Annotated[Path | None, typer.Option("--from-measurements", help="Re-fit an earlier calibration's .measurements.csv (no live backend needed).")] = None,
) -> None:
    """Measure the live backend (engines, trainer, weight sync, role switches, tools) and
    fit the simulator's cost model to it."""
    from rlsched.calibration_io import check_calibration_out
    from rlsched.config import ConfigFile, load_config

    check_calibration_out(out)  # (before minutes of measuring: a bad --out lost them all)
    if from_measurements is not None:
        from rlsched.calibration import refit
        from rlsched.calibration_io import write_calibration

        result = refit(from_measurements)
        path = write_calibration(out, result)
        _print_quality(result.calibration.quality)
        typer.echo(f"re-fitted {result.info['measurements']} measurements; wrote {path}")
        return
    cfg = load_config(config) if config is not None else ConfigFile()
    try:
        from rlsched.real.calibrate.bench import BenchPlan
        from rlsched.real.calibrate.run import calibrate
        from rlsched.real.config import LiveSettings
    except ImportError as exc:
        raise ConfigError(f"the live backend is not available ({exc}); install it with .ci/install-live") from None
    run = cfg.run if config is not None else cfg.run.with_overrides(gpus=2, tp=1)
    settings = LiveSettings.from_config(cfg.live)
    plan = _quick_plan(BenchPlan) if quick else BenchPlan()
    say = _say()
    from rlsched.calibration import fit_measurements
    from rlsched.calibration_io import write_calibration

    result = fit_measurements(*calibrate(run, settings, seed=seed, plan=plan, say=say))
    path = write_calibration(out, result)
    _print_quality(result.calibration.quality)
    typer.echo(f"tools (median s): {_fmt_tools(result.info['tools_median_seconds'])}", err=True)
    typer.echo(f"calibrated in {result.info['seconds']:.0f}s; wrote {path}")


def _quick_plan(cls):  # -> BenchPlan
    return cls(decode_batches=(1, 4, 16), decode_prompts=(32, 1024), decode_tokens=12,
               prefill_new=(16, 512, 1536), prefill_cached=(0, 1024),
               train_shapes=((1, 256), (4, 512), (2, 1536)), sync_repeats=2, switch_rounds=1,
               tool_episodes=1, repeats=1)


def _say():
    def say(msg: str) -> None:
        typer.echo(f"  {msg}", err=True)

    return say


def _fmt_tools(tools: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in sorted(tools.items())) or "none"


def _print_quality(quality) -> None:
    """One plain line per component (readable in a log, never truncated)."""
    typer.echo("cost-model fit per component (R² blank for a constant):", err=True)
    for q in quality:
        r2 = "   —  " if q.r2 != q.r2 else f"{q.r2:6.3f}"
        unit = " tok" if q.component == "kv_capacity" else "s"
        fitted = ", ".join(f"{k}={v:.4g}" for k, v in q.fitted.items())
        typer.echo(
            f"  {q.component:<12} n={q.n:<4} R²={r2}  worst {q.worst_residual_s:.4g}{unit} "
            f"({q.worst_residual_pct:.1f}%)  median {q.median_residual_pct:.1f}%  {fitted}"
            + (f"  [{q.note}]" if q.note else ""), err=True)


def fidelity_cmd(
    run_dir: Annotated[Path, typer.Argument(help="A live run directory (rlsched run --live --out DIR).")],
    out: Annotated[Path, typer.Option("--out", help="Output directory (fidelity.csv, report).")],
    cost: Annotated[Path | None, typer.Option("--cost", help="Cost-model file, e.g. from `rlsched calibrate`.")] = None,
    repeat: Annotated[Path | None, typer.Option("--repeat", help="A second live run of the same config: its run-to-run spread is reported beside the error.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty --out directory.")] = False,
) -> None:
    """Replay a live run's trace in the simulator (same policy, config, cost model) and
    compare step by step."""
    from rlsched.analysis.fidelity_report import write_fidelity_report
    from rlsched.fidelity import fidelity
    from rlsched.sim.cost import CostModel

    model = CostModel.from_file(cost) if cost is not None else CostModel()
    result = fidelity(run_dir, model, out, force=force, repeat=repeat,
                      inputs=(cost,) if cost is not None else ())
    write_fidelity_report(result, out, cost_file=cost)
    s = result.summary
    spread = "" if s.get("spread_median_pct") is None else f", live spread median {s['spread_median_pct']:.1f}%"
    typer.echo(
        f"{s['policy']}: {s['steps']} steps, median per-step error {s['median_abs_error_pct']:.1f}% "
        f"(max {s['max_abs_error_pct']:.1f}%){spread}; role/sync order "
        f"{'identical' if s['order_identical'] else 'differs'}", err=True,
    )
    typer.echo(f"wrote {out / 'fidelity.csv'} and {out / 'fidelity.html'}")
