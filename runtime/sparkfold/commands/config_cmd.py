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
@click.option(
    "--image-profile",
    metavar="PROFILE",
    type=click.Path(dir_okay=False),
    help="Check the tensorfold settings against this image profile, not engine.tensorfold.image_profile.",
)
@json_option
def check(file: str, image_profile: str | None, as_json: bool) -> None:
    """Validate FILE offline; name each offending key and why.

    With the tensorfold engine, every setting must be one the engine image can honour (its
    profile, docs/patches.md); one it cannot is refused, naming the image.
    """
    settings = load_settings(file)
    image = ""
    if settings.engine.kind == "tensorfold":
        from sparkfold.engines.tensorfold.profile import ProfileError, profile_of, refusal

        try:
            profile = profile_of(settings, image_profile)
        except ProfileError as exc:
            raise click.ClickException(f"{file}: {exc}") from None
        refused = refusal(settings, profile)
        if refused is not None:
            raise click.ClickException(f"{file}: {refused}")
        image = f", {profile}"
    if as_json:
        echo_json({"ok": True, "file": file, "engine_fingerprint": engine_fingerprint(settings)})
    else:
        rank = f"rank {settings.node.rank} of {settings.engine.tp}"
        click.echo(f"{file}: ok ({rank}, engine {settings.engine.kind}{image})")


@command.command()
@click.argument("file", type=click.Path(dir_okay=False))
def fingerprint(file: str) -> None:
    """Print the sha256 of FILE's [engine] section, which every rank must share."""
    click.echo(engine_fingerprint(load_settings(file)))
