"""``sparkfold engine --config FILE [--dry-run] [--json]``: run this node's engine rank."""

from __future__ import annotations

import shlex
from typing import Any

import click

from sparkfold.commands._options import config_option, echo_json, json_option
from sparkfold.config import Settings
from sparkfold.engines.startup import RankError
from sparkfold.node.supervisor import describe, run_rank


@click.command()
@config_option
@click.option(
    "--dry-run", is_flag=True, help="Print what would run (engine, model, rank, addresses); run nothing."
)
@json_option
def command(settings: Settings, dry_run: bool, as_json: bool) -> None:
    """Run this node's engine rank (rank 0 serves the engine protocol on engine.host:engine.port)."""
    try:
        if not dry_run:
            raise SystemExit(run_rank(settings))
        plan = describe(settings)
    except RankError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        echo_json(plan)
    else:
        for key, value in plan.items():
            click.echo(f"{key:12} {_shown(value)}")


def _shown(value: Any) -> str:
    """A plan value for people: argv as a line to paste, a mapping one ``NAME=value`` a line."""
    if isinstance(value, list):
        return shlex.join(str(item) for item in value)
    if isinstance(value, dict):
        return "".join(f"\n  {name}={item}" for name, item in sorted(value.items())) or "(none)"
    return str(value)
