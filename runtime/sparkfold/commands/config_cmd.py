"""``sparkfold config check|fingerprint FILE``."""

from __future__ import annotations

import click

from sparkfold.commands._options import echo_json, json_option, load_settings
from sparkfold.config import engine_fingerprint


@click.group()
def command() -> None:
    """Validate a settings file, or print its engine fingerprint."""


@command.command()
@click.argument("file", type=click.Path(dir_okay=False))
@json_option
def check(file: str, as_json: bool) -> None:
    """Validate FILE offline; name each offending key and why."""
    settings = load_settings(file)
    if as_json:
        echo_json({"ok": True, "file": file, "engine_fingerprint": engine_fingerprint(settings)})
    else:
        click.echo(
            f"{file}: ok (rank {settings.node.rank} of {settings.engine.tp}, engine {settings.engine.kind})"
        )


@command.command()
@click.argument("file", type=click.Path(dir_okay=False))
def fingerprint(file: str) -> None:
    """Print the sha256 of FILE's [engine] section, which every rank must share."""
    click.echo(engine_fingerprint(load_settings(file)))
