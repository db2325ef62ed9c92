"""``rlsched policy list|check``: what policies exist, and whether one keeps the contract."""

from __future__ import annotations

from typing import Annotated

import typer

policy_app = typer.Typer(help="List policies and check them against the contract.", no_args_is_help=True,
                         rich_markup_mode=None)


@policy_app.command("list")
def list_cmd() -> None:
    """Registered policies (shipped and from the `rlsched.policies` entry-point group)."""
    from rich.console import Console
    from rich.table import Table

    from rlsched.policies import available

    table = Table(title="policies")
    for c in ("name", "parameter", "type", "default", "range", "help"):
        table.add_column(c)
    for name, cls in available().items():
        if not cls.params:
            table.add_row(name, "-", "", "", "", _summary(cls))
        for i, p in enumerate(cls.params):
            rng = "|".join(p.choices) if p.choices else (f"{p.low:g}..{p.high:g}" if p.low is not None else "")
            table.add_row(name if i == 0 else "", p.name, p.kind, str(p.default), rng, p.help)
    Console().print(table)


def _summary(cls: type) -> str:
    import sys

    doc = cls.__doc__ or sys.modules[cls.__module__].__doc__ or ""
    lines = doc.strip().splitlines()
    return lines[0] if lines else ""


@policy_app.command("check")
def check_cmd(spec: Annotated[str, typer.Argument(help="Policy spec NAME[:key=value,...].")]) -> None:
    """Run the conformance kit on a policy; exit 1 if it breaks the contract."""
    from rlsched.conformance import check_policy
    from rlsched.policies import make_policy

    make_policy(spec)  # a bad spec is the user's error: one line, exit 2
    report = check_policy(lambda: make_policy(spec))
    typer.echo(str(report))
    if not report.ok:
        raise typer.Exit(1)
