"""``sparkfold router --config FILE``: run SMG for the fleet, its keys read from files."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from sparkfold.commands._options import fleet_option
from sparkfold.fleet.settings import FleetSettings


@click.command()
@fleet_option
@click.option("--dry-run", is_flag=True, help="Print the `smg launch` options (no keys) and exit.")
@click.option(
    "--write-manifest",
    is_flag=True,
    help="Only rewrite SMG's worker manifest from [[pairs]] (SMG rereads it: add or drain a pair).",
)
def command(fleet: tuple[FleetSettings, Path], dry_run: bool, write_manifest: bool) -> None:
    """Run SMG on loopback in front of the pairs of fleet.toml (policy, health checks, retries)."""
    from sparkfold.fleet import router

    settings, _ = fleet
    if dry_run:
        click.echo("smg launch " + shlex.join(router.router_argv(settings)))
        return
    try:
        written = router.write_manifest(settings)
    except OSError as exc:
        raise click.ClickException(f"cannot write {settings.router.workers_file}: {exc.strerror}") from None
    if write_manifest:
        serving = len(settings.serving)
        click.echo(f"{written}: {serving} of {len(settings.pairs)} pairs take new conversations")
        return
    try:
        router.launch(settings)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
