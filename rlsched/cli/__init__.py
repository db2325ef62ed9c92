"""The ``rlsched`` command line: the composition root.

Errors a user can cause arrive here as :class:`~rlsched.cluster.errors.RlschedError` and
leave as one line on stderr and exit code 2 -- no traceback. Each verb lives in its own
module of this package (``run`` -- also ``compare`` --, ``plan``, ``policy``, ``trace`` with
``trace_import``, ``report``, ``calibrate``, ``cost``), attached in :func:`build_app`.
"""

from __future__ import annotations

import typer

from rlsched.cluster.errors import Interrupted, RlschedError


def fail(message: str, code: int = 2) -> None:
    """Print one error line and exit; the single place the CLI turns errors into exits."""
    typer.echo(f"rlsched: error: {message}", err=True)
    raise typer.Exit(code)


def usage_line(exc: Exception) -> str:
    """A usage error as one line that names the command and where its help is."""
    fmt = getattr(exc, "format_message", None)
    message = " ".join(str(fmt() if fmt else exc).split())
    ctx = getattr(exc, "ctx", None)
    if ctx is None:
        return message
    return f"{ctx.command_path}: {message} (see '{ctx.command_path} --help')"


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="rlsched",
        help="Compare RL rollout/train scheduling policies on traces, then run them live.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,  # help text shows [cluster], [[policy]] literally
    )
    from . import calibrate, cost, plan, policy, report, run, trace, trace_import

    run.register(app)
    plan.register(app)
    app.add_typer(policy.policy_app, name="policy")
    trace_import.register(trace.trace_app)
    app.add_typer(trace.trace_app, name="trace")
    report.register(app)
    calibrate.register(app)
    cost.register(app)
    return app


def main(argv: list[str] | None = None) -> int:
    app = build_app()
    try:
        # (not standalone, click returns the code of a typer.Exit raised by a command --
        # policy check's failure, or its own Exit(130) for a Ctrl-C -- rather than raising
        # it: dropped, both exited 0)
        code = app(args=argv, prog_name="rlsched", standalone_mode=False)
        if isinstance(code, int) and not isinstance(code, bool) and code:
            if code == 130:
                typer.echo("rlsched: interrupted", err=True)
            return code
    except Interrupted as err:  # Ctrl-C after part of the work was written: say what was kept
        typer.echo(f"rlsched: interrupted: {err}", err=True)
        return err.exit_code
    except RlschedError as err:
        typer.echo(f"rlsched: error: {err}", err=True)
        return err.exit_code
    except KeyboardInterrupt:
        typer.echo("rlsched: interrupted", err=True)
        return 130
    except MemoryError:  # e.g. --gpus 100000000: the cluster's state alone does not fit
        typer.echo("rlsched: error: out of memory: the run is too large for this machine "
                   "(fewer --gpus, --steps or tasks per step)", err=True)
        return 2
    except typer.Exit as ex:
        return ex.exit_code
    except typer.Abort:
        return 130
    except typer.TyperException as exc:  # usage errors: unknown option, missing argument
        typer.echo(f"rlsched: error: {usage_line(exc)}", err=True)
        return int(getattr(exc, "exit_code", 2) or 2)
    return 0
