"""``sparkfold image hash|apply``: the engine image's patch series, for the image role."""

from __future__ import annotations

import click

from sparkfold.commands._options import echo_json, json_option

series_option = click.option(
    "--series",
    "series_file",
    metavar="FILE",
    required=True,
    type=click.Path(dir_okay=False),
    help="The series file, e.g. patches/tensorfold/v0.6.0/series.",
)


@click.group()
def command() -> None:
    """Hash or apply the engine image's patch series (docs/patches.md)."""


@command.command("hash")
@series_option
@click.option("--base", metavar="IMAGE", required=True, help="Base image reference (by digest if pinned).")
@click.option("--ref", metavar="REF", required=True, help="TensorFold ref, e.g. v0.6.0@<commit sha>.")
@click.option("--extra", "extras", metavar="SPEC", multiple=True, help="A pinned pip extra; repeatable.")
@json_option
def hash_(series_file: str, base: str, ref: str, extras: tuple[str, ...], as_json: bool) -> None:
    """Print the image label: sha256 of base, ref, the ordered patches' content, and the extras."""
    from sparkfold.image.patches import LABEL, PatchError, hash_of, read_series

    try:
        series = read_series(series_file)
        digest = hash_of(series, base=base, ref=ref, extras=extras)
    except (PatchError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        echo_json({"label": LABEL, "hash": digest, "patches": [p.name for p in series.patches]})
    else:
        click.echo(digest)


@command.command("apply")
@series_option
@click.option(
    "--tree",
    metavar="DIR",
    required=True,
    type=click.Path(file_okay=False, exists=True),
    help="The source tree the patch paths are relative to.",
)
@json_option
def apply(series_file: str, tree: str, as_json: bool) -> None:
    """Apply the series to DIR in order; patches already applied are skipped.

    A patch that does not apply fails the command with its name, and nothing is written.
    """
    from sparkfold.image.patches import PatchError, apply_series, read_series

    try:
        steps = apply_series(read_series(series_file), tree)
    except PatchError as exc:
        raise click.ClickException(str(exc)) from None
    applied = sum(step.state == "applied" for step in steps)
    if as_json:
        echo_json({"ok": True, "changed": applied > 0, "patches": [step.__dict__ for step in steps]})
        return
    for step in steps:
        click.echo(f"{step.name}: {step.state}")
    click.echo(f"{tree}: {applied} applied, {len(steps) - applied} already applied")
