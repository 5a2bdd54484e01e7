"""``sparkfold weights manifest|verify|fetch|space``: the node's weights store, for the weights role.

Progress goes to stderr; ``--json`` answers go to stdout (shapes in docs/weights.md). A failed check
prints its JSON first, then one line on stderr, and exits 1.
"""

from __future__ import annotations

from pathlib import Path

import click

from sparkfold.commands._options import echo_json, json_option
from sparkfold.weights.disk import DEFAULT_RESERVE_GIB
from sparkfold.weights.hashing import DEFAULT_JOBS

jobs_option = click.option(
    "--jobs",
    metavar="N",
    type=click.IntRange(min=1),
    default=DEFAULT_JOBS,
    show_default=True,
    help="Files hashed at once.",
)
manifest_option = click.option(
    "--manifest",
    "manifest_file",
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The manifest.  [default: DIR.manifest.json, beside DIR]",
)
reserve_option = click.option(
    "--reserve-gib",
    metavar="GIB",
    type=click.FloatRange(min=0),
    default=DEFAULT_RESERVE_GIB,
    show_default=True,
    help="Space to keep free on the store's filesystem after the transfer.",
)
dir_argument = click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))


@click.group()
def command() -> None:
    """Describe, verify and fetch model weights in a store directory (docs/weights.md)."""


@command.command("manifest")
@dir_argument
@click.option(
    "--out",
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the manifest here (unchanged content is not rewritten); without it, print it.",
)
@click.option("--repo", metavar="ID", help="Record the Hugging Face repo id the files came from.")
@click.option("--revision", metavar="COMMIT", help="Record the commit the files came from.")
@jobs_option
@json_option
def manifest(
    directory: Path, out: Path | None, repo: str | None, revision: str | None, jobs: int, as_json: bool
) -> None:
    """Hash every file in DIR (sizes and sha256, progress on stderr) into a manifest."""
    from sparkfold.weights import WeightsError, build_manifest, write_manifest
    from sparkfold.weights.progress import human_bytes

    try:
        built = build_manifest(directory, repo=repo, revision=revision, jobs=jobs)
        changed = write_manifest(built, out) if out is not None else False
    except (WeightsError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    if out is None:
        click.echo(built.to_json(), nl=False)
    elif as_json:
        summary = {"changed": changed, "manifest": str(out), "digest": built.digest}
        echo_json({**summary, "files": len(built.files), "total_bytes": built.total_bytes})
    else:
        state = "wrote" if changed else "unchanged"
        size = human_bytes(built.total_bytes)
        click.echo(f"{out}: {state}, {len(built.files)} files, {size}, digest {built.digest}")


@command.command("verify")
@dir_argument
@manifest_option
@click.option("--sizes-only", is_flag=True, help="Compare names and sizes only (fast re-check, no hashing).")
@jobs_option
@json_option
def verify(directory: Path, manifest_file: Path | None, sizes_only: bool, jobs: int, as_json: bool) -> None:
    """Check DIR against its manifest; names every missing, extra or differing file."""
    from sparkfold.weights import WeightsError, default_manifest_path, read_manifest, verify_dir

    try:
        expected = read_manifest(manifest_file or default_manifest_path(directory))
        report = verify_dir(directory, expected, sizes_only=sizes_only, jobs=jobs)
    except (WeightsError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        echo_json(report.to_json())
    if not report.ok:
        raise click.ClickException(report.message())
    if not as_json:
        click.echo(report.message())


@command.command("space")
@dir_argument
@manifest_option
@reserve_option
@json_option
def space(directory: Path, manifest_file: Path | None, reserve_gib: float, as_json: bool) -> None:
    """Check that DIR's filesystem holds the manifest's files still missing in DIR (before a copy)."""
    from sparkfold.weights import WeightsError, default_manifest_path, list_files, read_manifest
    from sparkfold.weights.disk import check_space, missing_bytes
    from sparkfold.weights.progress import human_bytes

    try:
        expected = read_manifest(manifest_file or default_manifest_path(directory))
        need = missing_bytes(((f.path, f.size) for f in expected.files), list_files(directory))
        check = check_space(directory, need, reserve_gib=reserve_gib)
    except (WeightsError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        echo_json(check.to_json())
    else:
        to_copy, free = human_bytes(check.need_bytes), human_bytes(check.free_bytes)
        click.echo(f"{directory}: {to_copy} still to copy, {free} free")


@command.command("fetch")
@click.option("--repo", metavar="ID", required=True, help="Hugging Face repo id, e.g. org/name.")
@click.option(
    "--revision",
    metavar="COMMIT",
    required=True,
    help="The pinned 40-hex commit (a branch needs --allow-moving-revision).",
)
@click.option(
    "--dest",
    metavar="DIR",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The store directory for this revision's files.",
)
@manifest_option
@click.option(
    "--token-file",
    metavar="FILE",
    envvar="SPARKFOLD_HF_TOKEN_FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="File holding a Hugging Face read token (mode 0600); never printed.  [default: huggingface_hub's]",
)
@click.option(
    "--allow-moving-revision",
    is_flag=True,
    help="Accept a branch or tag and pin what it points to now (the manifest records the commit).",
)
@click.option(
    "--endpoint",
    metavar="URL",
    envvar="HF_ENDPOINT",
    help="The Hub (or a mirror).  [default: huggingface_hub's]",
)
@reserve_option
@click.option(
    "--recheck",
    type=click.Choice(["sizes", "sha256"]),
    default="sizes",
    show_default=True,
    help="How a store that already holds the revision is checked before saying nothing changed.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Check and plan only: what would be downloaded and whether it fits; writes nothing.",
)
@click.option(
    "--pin",
    "pinned",
    metavar="PATH=SHA256",
    multiple=True,
    help="A file's pinned sha256; repeatable. A file that differs refuses the store, naming it.",
)
@jobs_option
@json_option
def fetch(
    repo: str,
    revision: str,
    dest: Path,
    manifest_file: Path | None,
    token_file: Path | None,
    allow_moving_revision: bool,
    endpoint: str | None,
    reserve_gib: float,
    recheck: str,
    dry_run: bool,
    pinned: tuple[str, ...],
    jobs: int,
    as_json: bool,
) -> None:
    """Download a pinned revision into DEST, verify it against the Hub, write its manifest.

    Resumable: files already in place are kept; a re-run of a complete store does not contact the Hub
    (so it also works with HF_HUB_OFFLINE=1).
    """
    from sparkfold.weights import WeightsError
    from sparkfold.weights.fetch import fetch as fetch_revision
    from sparkfold.weights.verify import parse_pins

    try:
        result = fetch_revision(
            repo,
            revision,
            dest,
            manifest_path=manifest_file,
            token_file=token_file,
            allow_moving_revision=allow_moving_revision,
            endpoint=endpoint,
            reserve_gib=reserve_gib,
            recheck="sha256" if recheck == "sha256" else "sizes",
            jobs=jobs,
            dry_run=dry_run,
            warn=lambda line: click.echo(line, err=True),
            pins=parse_pins(pinned),
        )
    except (WeightsError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        echo_json(result.to_json())
        return
    verb = "would download" if dry_run else "downloaded"
    state = f"{verb} {len(result.downloaded)} files" if result.downloaded else "already complete"
    click.echo(f"{repo}@{result.commit} in {dest}: {state}; manifest {result.manifest_path}")
