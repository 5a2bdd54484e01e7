"""``sparkfold image hash|apply|label|fetch|pull|plan``: the engine image's patch series, for the image role.

``hash --context DIR`` hashes a ready build context instead (the testbed's stand-in); its
``profile.toml``, if any, says what that image supports.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sparkfold.commands._options import echo_json, json_option

if TYPE_CHECKING:
    from sparkfold.image.plan import HashInputs

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
    """The engine image: its patch series (hash, apply, label, fetch), a published image, the plan.

    docs/patches.md."""


extra_option = click.option(
    "--extra", "extras", metavar="SPEC", multiple=True, help="A pinned pip extra; repeatable, in order."
)


@command.command("hash")
@series_option
@click.option("--base", metavar="IMAGE", help="Base image reference (by digest if pinned).")
@click.option("--ref", metavar="REF", required=True, help="TensorFold ref, e.g. v0.6.0@<commit sha>.")
@click.option(
    "--context",
    "context_dir",
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="A ready build context (sparkfold_image_source: context): its files' digest stands for the base.",
)
@extra_option
@click.option(
    "--external-source",
    metavar="URL@COMMIT:FOLDER",
    help="An external series applied before --series (sparkfold image fetch); its source.",
)
@click.option(
    "--external",
    "external_files",
    metavar="NAME=SHA256",
    multiple=True,
    help="A verified file of the external series, in order; repeatable.",
)
@click.option("--external-strip", type=int, default=0, show_default=True, help="The external series' -pN.")
@json_option
def hash_(
    series_file: str,
    base: str | None,
    ref: str,
    context_dir: str | None,
    extras: tuple[str, ...],
    external_source: str | None,
    external_files: tuple[str, ...],
    external_strip: int,
    as_json: bool,
) -> None:
    """Print the image label: sha256 of base, ref, the ordered patches' content, and the extras."""
    from sparkfold.image.external import parse_file_pin
    from sparkfold.image.patches import LABEL, PatchError, read_series
    from sparkfold.image.plan import HashInputs

    if (base is None) == (context_dir is None):
        raise click.UsageError("give --base IMAGE (a TensorFold build) or --context DIR (a ready context)")
    try:
        pins = [parse_file_pin(text) for text in external_files] if external_source is not None else []
        if any(pin.sha256 is None for pin in pins):
            raise click.UsageError("--external needs NAME=SHA256 (a verified digest)")
        inputs = HashInputs(
            ref=ref,
            base=base or "",
            context=context_dir or "",
            extras=extras,
            external_source=external_source or "",
            external_strip=external_strip,
            external=tuple((pin.name, str(pin.sha256)) for pin in pins),
        )
        digest = _hash_of(series_file, inputs)
        series = read_series(series_file)
    except (PatchError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        echo_json(
            {
                "label": LABEL,
                "hash": digest,
                "patches": [p.name for p in series.patches],
                "supports": _supports(Path(context_dir or Path(series_file).parent) / "profile.toml"),
            }
        )
    else:
        click.echo(digest)


def _hash_of(series_file: str, inputs: HashInputs) -> str:
    """The series hash of our series with ``inputs`` (a ready context: its files' digest for the base)."""
    from sparkfold.image.context import context_digest
    from sparkfold.image.patches import hash_of, read_series

    base = f"context:{context_digest(Path(inputs.context))}" if inputs.context else inputs.base
    external = (
        (inputs.external_source, [(name, inputs.external_strip, sha) for name, sha in inputs.external])
        if inputs.external_source
        else None
    )
    return hash_of(
        read_series(series_file), base=base, ref=inputs.ref, extras=inputs.extras, external=external
    )


def _supports(path: Path) -> list[str]:
    """The features a ``profile.toml`` (beside the series file, or in a ready context) declares; none
    without one."""
    from sparkfold.engines.tensorfold.profile import ProfileError, load_profile

    if not path.exists():
        return []
    try:
        return sorted(load_profile(path).supports)
    except ProfileError as exc:
        raise click.ClickException(str(exc)) from None


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


@command.command("label")
@click.option(
    "--series",
    "series_files",
    metavar="FILE",
    multiple=True,
    required=True,
    type=click.Path(dir_okay=False),
    help="A series file; repeatable, in the order the series apply (the external one first).",
)
@extra_option
@json_option
def label(series_files: tuple[str, ...], extras: tuple[str, ...], as_json: bool) -> None:
    """Print the reference recipe's tf.patches label of these series and extras (12 hex digits)."""
    from sparkfold.image.patches import PatchError, read_series
    from sparkfold.image.published import RECIPE_LABEL, recipe_label_of

    try:
        value = recipe_label_of([read_series(path) for path in series_files], extras)
    except (PatchError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        echo_json({"label": RECIPE_LABEL, "value": value})
    else:
        click.echo(value)


@command.command("fetch")
@click.option("--repo", metavar="URL", required=True, help="Git repository of the series.")
@click.option("--commit", metavar="SHA", required=True, help="The full commit (not a tag: tags move).")
@click.option("--folder", metavar="DIR", default="patches", show_default=True, help="The series' folder.")
@click.option(
    "--dest",
    metavar="DIR",
    required=True,
    type=click.Path(file_okay=False),
    help="Where the checkout and the verified series go (DIR/checkout, DIR/series/series).",
)
@click.option(
    "--file",
    "files",
    metavar="NAME=SHA256",
    multiple=True,
    help="A patch file and its pinned sha256, in order; repeatable. None: every *.patch, digests reported.",
)
@click.option("--strip", type=int, default=0, show_default=True, help="The series' -pN (the recipe's: 0).")
@json_option
def fetch(
    repo: str, commit: str, folder: str, dest: str, files: tuple[str, ...], strip: int, as_json: bool
) -> None:
    """Fetch an external patch series at a commit and verify every file's sha256.

    A file whose digest differs from its pin stops the command, naming it; nothing is laid out then.
    """
    from sparkfold.image.external import fetch_series, parse_file_pin
    from sparkfold.image.patches import PatchError

    try:
        pins = [parse_file_pin(text) for text in files]
        done = fetch_series(repo=repo, commit=commit, folder=folder, dest=dest, files=pins, strip=strip)
    except PatchError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        echo_json(
            {
                "ok": True,
                "commit": done.commit,
                "series": str(done.series),
                "fetched": done.fetched,
                "files": [{"name": f.name, "sha256": f.sha256} for f in done.files],
                "unpinned": list(done.unpinned),
            }
        )
        return
    for entry in done.files:
        click.echo(
            f"{entry.name} sha256 {entry.sha256}" + (" (not pinned)" if entry.name in done.unpinned else "")
        )
    click.echo(f"{done.series}: {len(done.files)} verified patch(es) of {repo}@{commit[:12]}")


@command.command("pull")
@click.option("--ref", metavar="NAME@sha256:DIGEST", required=True, help="The published image, by digest.")
@click.option(
    "--label", "expected", metavar="HEX12", required=True, help="The tf.patches label it must carry."
)
@click.option(
    "--tag", metavar="NAME", required=True, help="The local tag to give it (engine.tensorfold.image)."
)
@click.option("--check", is_flag=True, help="Only say whether a pull is due; pull nothing.")
@json_option
def pull(ref: str, expected: str, tag: str, check: bool, as_json: bool) -> None:
    """Pull a published engine image by digest; accept it only when its tf.patches label matches."""
    from sparkfold.image.published import PublishedImageRefused, pull_published

    try:
        done = pull_published(ref, label=expected, tag=tag, check=check)
    except PublishedImageRefused as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        echo_json(
            {"ok": True, "ref": done.ref, "tag": done.tag, "label": done.label, "changed": done.changed}
        )
    else:
        state = ("would pull" if check else "pulled and tagged") if done.changed else "already current"
        click.echo(f"{tag}: {state} ({ref}, tf.patches={done.label})")


@command.command("plan")
@click.option(
    "--inventory-vars",
    "vars_file",
    metavar="FILE",
    default="-",
    show_default=True,
    type=click.File(),
    help="The inventory's image variables (YAML or JSON, the role's names and defaults); - is stdin.",
)
@click.option(
    "--records",
    "records_dir",
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="The pins recorded on the control host. Default: <sparkfold_control_dir>/pins/<inventory name>.",
)
@click.option(
    "--probe",
    "probe_file",
    metavar="FILE",
    type=click.File(),
    help="This run's facts (YAML or JSON): nodes' Docker and labels, the series hash, what was resolved.",
)
@click.option(
    "--results",
    "results_text",
    metavar="JSON",
    help="This run's probe results as Ansible registered them (the image role's tasks/plan.yml): "
    "read as --probe's facts.",
)
@click.option(
    "--hash",
    "with_hash",
    is_flag=True,
    help="Also compute the series hash of the pins in effect (needs --series), and each node's currency.",
)
@click.option(
    "--series",
    "series_file",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="Our own series file: what its profile.toml supports joins the profile (as for image hash; "
    "a ready context's own profile.toml instead).",
)
@json_option
def plan_(
    vars_file: Any,
    records_dir: str | None,
    probe_file: Any,
    results_text: str | None,
    with_hash: bool,
    series_file: str | None,
    as_json: bool,
) -> None:
    """Say what the image stage will do: the way, every pin and its source, each node's currency,
    the profile, and the stop if any (exit status 1 then)."""
    from sparkfold.image.patches import PatchError
    from sparkfold.image.plan import ImageVars, PlanError, Probe, Records, plan, read_mapping

    try:
        values = read_mapping(vars_file.read(), f"--inventory-vars {vars_file.name}")
        image_vars = ImageVars.from_mapping(values)
        if records_dir is None:
            control = values.get("sparkfold_control_dir")
            if not control:
                raise PlanError("give --records DIR, or sparkfold_control_dir in the inventory variables")
            records_dir = str(Path(control) / "pins" / image_vars.inventory_name)
        if probe_file and results_text is not None:
            raise click.UsageError("give --probe FILE or --results JSON, not both")
        probe = (
            Probe.from_mapping(read_mapping(probe_file.read(), f"--probe {probe_file.name}"))
            if probe_file
            else Probe.from_results(read_mapping(results_text, "--results"))
            if results_text is not None
            else None
        )
        if with_hash and not series_file:
            raise click.UsageError("--hash needs --series FILE (our own series)")
        # As `image hash`: a ready context's profile.toml, else the one beside our series.
        context = image_vars.sparkfold_image_source == "context" and image_vars.sparkfold_image_context_dir
        folder = Path(context) if context else Path(series_file).parent if series_file else None
        supports = _supports(folder / "profile.toml") if folder else []
        hasher = (lambda inputs: _hash_of(str(series_file), inputs)) if with_hash else None
        done = plan(image_vars, Records(Path(records_dir)), probe, series_supports=supports, hasher=hasher)
    except (PlanError, PatchError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        echo_json(done.as_dict())
    else:
        click.echo(f"way: {done.way}" + (f" ({done.source})" if done.source else ""))
        for pin in done.pins:
            record = f", record {pin.record_file}" if pin.record_file else ""
            to_record = " (to record)" if pin.record else ""
            click.echo(f"pin {pin.what}: {pin.value or '-'} [{pin.source}{record}]{to_record}")
        for node in done.nodes:
            click.echo(f"node {node.node}: {node.state} ({node.why})")
        if done.profile_name:
            click.echo(f"profile: {done.profile_name} supports {', '.join(done.supports) or 'nothing'}")
        if done.stop:
            click.echo(f"stop: {done.stop}")
    if done.stop:
        raise SystemExit(1)
