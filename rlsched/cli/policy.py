"""``rlsched policy list|check``: what policies exist, and whether one keeps the contract."""

from __future__ import annotations

from typing import Annotated

import typer

policy_app = typer.Typer(help="List policies and check them against the contract.", no_args_is_help=True,
                         rich_markup_mode=None)


@policy_app.command("list")
def list_cmd() -> None:
    """Registered policies (shipped and from the `rlsched.policies` entry-point group)."""
    from rlsched.policies import available
    from rlsched.ui import print_rows

    rows: list[tuple[str, ...]] = []
    for name, cls in available().items():
        if not cls.params:
            rows.append((name, "-", "", "", "", _summary(cls)))
        for i, p in enumerate(cls.params):
            rng = "|".join(p.choices) if p.choices else (f"{p.low:g}..{p.high:g}" if p.low is not None else "")
            rows.append((name if i == 0 else "", p.name, p.kind, str(p.default), rng, p.help))
    print_rows("policies", ("name", "parameter", "type", "default", "range", "help"), rows)


def _summary(cls: type) -> str:
    import sys

    doc = cls.__doc__ or sys.modules[cls.__module__].__doc__ or ""
    lines = doc.strip().splitlines()
    return lines[0] if lines else ""


@policy_app.command("check")
def check_cmd(spec: Annotated[str, typer.Argument(help="Policy spec NAME[:key=value,...].")]) -> None:
    """Run the conformance kit on a policy; exit 1 if it breaks the contract."""
    from rlsched.conformance import Report, check_policy
    from rlsched.policies import make_policy, parse_spec
    from rlsched.policies.plugins import PluginError

    name, _ = parse_spec(spec)
    try:
        make_policy(spec)  # a bad spec is the user's error: one line, exit 2
    except PluginError as err:  # this plugin's own defect (its params, its constructor): a FAIL
        if err.policy != name:
            raise  # (another plugin's, which broke the lookup: the error line, exit 2)
        report = Report(name, [str(err)])
    else:
        report = check_policy(lambda: make_policy(spec))
    typer.echo(str(report))
    if not report.ok:
        raise typer.Exit(1)
