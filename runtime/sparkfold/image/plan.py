"""The image stage's decisions in one place: which way, which pins, which node is current, the profile.

:func:`plan` takes the inventory's image variables (:class:`ImageVars`, the names the image role
reads, its defaults applied), the pins recorded on the control host (:class:`Records`) and what
this run found out (:class:`Probe`: each node's Docker and image labels, and what the head resolved
now), and returns one :class:`ImagePlan`. Nothing here runs a command or writes a file: the role probes,
asks for the plan (``sparkfold image plan --json``) and carries it out.

How the role carries it out (``roles/sparkfold_image/``): ``tasks/plan.yml`` runs this on the
control host before anything else, with the role's variables as it sees them and no probe, and
again after each probe, with the probes' results as Ansible registered them (``--results``, read by
:mod:`sparkfold.image.probes`: :meth:`Probe.from_results`); the role keeps the latest plan as the
fact ``_sparkfold_image_plan`` and reads its decisions there, none in Jinja:

* the way: ``tasks/main.yml`` includes ``way-<way>.yml``. ``none`` unless ``sparkfold_engine`` is
  ``tensorfold`` (the venv engines); ``published`` when ``sparkfold_image_registry_ref`` is set
  (pulled by digest on every node); else a build on the head: ``build`` from an external series
  (``sparkfold_image_series_ref``) or a ready context (``sparkfold_image_source: context``),
  ``stock`` for TensorFold with only our own series;
* each node (``node``, by name; after ``tasks/docker.yml``): whether Docker answers there and why
  not, its image's series label, and, once the series hash is computed (``tasks/hash.yml``:
  ``--hash``, over the pins in effect, :class:`HashInputs`), whether the image is ``current``;
  ``head_docker`` and ``build_due`` for the head;
* the pins, trust on first use: the inventory's value, else the one recorded under
  ``<control_dir>/pins/<inventory>/``, else the one resolved now. The kinds the plan lists in
  ``to_record`` are resolved on the head (``pin.yml``: the tag, ``tag``; ``base.yml``: the base
  image; ``series.yml``: the external series, ``fetch`` and ``fetched``) and written to
  ``record_files`` through the one ``roles/sparkfold/tasks/pins.yml``; a build takes ``commit``,
  ``base`` and ``pinned_ref`` in effect;
* the stops, keyed (``stops``), in the order the role meets them, with the words users see
  (:data:`STOPS`): the role asserts each where it meets it (after the same steps as ever), in the
  plan's words, but a node's Docker, which it words node by node with the plan's ``problem``;
* a published image is accepted by ``published_label``: the recipe's label the head computed over
  the fetched series, else ``sparkfold_image_published_label``;
* the profile: ``profile.yml`` writes ``profile_name`` and ``supports``.

Given ``--probe`` facts (``sparkfold image plan`` by hand), the plan also says what the head
resolved now, whether each node's image is current and the stops those facts bring.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from sparkfold.image import probes
from sparkfold.image.patches import LABEL

__all__ = [
    "STOPS",
    "ImagePlan",
    "ImageVars",
    "NodeFacts",
    "NodeState",
    "Pin",
    "PlanError",
    "Probe",
    "Records",
    "plan",
    "read_mapping",
]

Way = Literal["published", "build", "stock", "none"]
Source = Literal["inventory", "recorded", "resolved-now", "unresolved"]
Currency = Literal["current", "stale", "missing", "unknown"]
Kind = Literal["image", "commit", "base", "series"]

_DIGEST = re.compile(r"^[^@]+@sha256:[0-9a-f]{64}$")
_PUBLISHED = re.compile(r"@sha256:[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")

# The role's stop messages (fail_msg of its asserts), word for word, with its Jinja fields as
# format fields: the role prints the plan's ``stop`` instead of keeping its own copy.
STOPS: dict[str, str] = {
    # tasks/docker.yml, "Stop if Docker does not answer on a node that must run the engine image"
    "docker": (
        "docker does not answer on {node} ({problem}): install Docker with the NVIDIA container runtime "
        "and start it (systemctl enable --now docker)"
    ),
    # tasks/source.yml, "Stop if the image source is not usable"
    "source": (
        "sparkfold_image_source is '{source}': with 'context', set sparkfold_image_context_dir to a "
        "build context folder on the control host (with its Dockerfile) and leave "
        "sparkfold_image_registry_ref empty"
    ),
    # tasks/base.yml, "Stop if the base image's digest is malformed"
    "base_malformed": ("sparkfold_image_base '{base}': a digest is written NAME:TAG@sha256:<64 hex digits>"),
    # vars/main.yml _sparkfold_image_unpinned_base (tasks/base.yml, when the digest is required)
    "base_unpinned": (
        "sparkfold_image_base is the tag {base}, not a digest: a rebuild would take whatever it points to "
        "then. On the head: docker pull {base} && docker image inspect --format "
        "'{{{{index .RepoDigests 0}}}}' {base}; then set in {inventory_dir}/group_vars/all/image.yml "
        "sparkfold_image_base: "
        '"{base}@sha256:<that digest>"'
    ),
    # tasks/base.yml, "Stop if the inventory's base digest is not the one recorded at first use"
    "base_mismatch": (
        "sparkfold_image_base pins {inventory}, but this control host recorded {recorded} for {name} when "
        "it first used it ({record}): copy the recorded one into the inventory (sparkfold_image_base: "
        '"{name}@{recorded}"), or, if the new digest is meant (a newer base), delete that file and run again'
    ),
    # tasks/hash.yml, "Stop if the image settings do not fit together"
    "settings": (
        "sparkfold_engine_tensorfold.image ({engine_image}) must equal sparkfold_image_name ({name}), and "
        "sparkfold_image_registry_ref ('{registry_ref}') must be empty or pinned by digest "
        "(<name>@sha256:<64 hex>)"
    ),
    # tasks/pull.yml, "Stop if there is no label to accept the published image by"
    "published_label": (
        "sparkfold_image_registry_ref ({registry_ref}) is accepted only by its tf.patches label: reference "
        "its patch series (sparkfold_image_series_ref) or set sparkfold_image_published_label (12 hex, the "
        "suffix of the recipe's published tag v0.6.0-<label>)"
    ),
    # tasks/build.yml, "Stop if the tag moved away from the pinned commit"
    "tag_moved": (
        "the tag moved: {ref} of {repo} now points to {now}, not the pinned {pinned} ({where}). Nothing was "
        "built. Review what changed upstream, check the patch series still applies (docs/patches.md), then "
        'set sparkfold_image_tensorfold_commit: "{now}"{delete}'
    ),
}


class PlanError(ValueError):
    """The planner's input is not usable (a missing variable, an unreadable record)."""


def read_mapping(text: str, where: str) -> dict[str, Any]:
    """A YAML (or JSON) mapping of variables or facts, read from ``where``."""
    try:
        found = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PlanError(f"{where}: not YAML or JSON: {exc}") from None
    if not isinstance(found, dict):
        raise PlanError(f"{where}: not a mapping of names to values")
    return found


@dataclass(frozen=True)
class ImageVars:
    """The inventory's image variables, named as the role reads them (defaults/main.yml applied)."""

    sparkfold_engine: str
    sparkfold_image_name: str
    sparkfold_image_source: str
    sparkfold_image_context_dir: str
    sparkfold_image_base: str
    sparkfold_image_base_digest_required: bool
    sparkfold_image_tensorfold_repo: str
    sparkfold_image_tensorfold_ref: str
    sparkfold_image_tensorfold_commit: str
    sparkfold_image_extras: tuple[str, ...]
    sparkfold_image_series_ref: Mapping[str, Any]
    sparkfold_image_registry_ref: str
    sparkfold_image_published_label: str
    sparkfold_image_published_supports: tuple[str, ...]
    sparkfold_image_docker_required: bool
    sparkfold_engine_tensorfold: Mapping[str, Any] = field(default_factory=dict)
    inventory_dir: str = "inventory"

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ImageVars:
        """From a mapping of variables (extra names ignored); a missing one is named."""
        names = [
            f for f in cls.__dataclass_fields__ if f not in ("sparkfold_engine_tensorfold", "inventory_dir")
        ]
        missing = [name for name in names if name not in values]
        if missing:
            raise PlanError(
                f"the image variables lack {', '.join(missing)} (roles/sparkfold_image/defaults/main.yml)"
            )
        kept = {name: values[name] for name in cls.__dataclass_fields__ if name in values}
        for name in ("sparkfold_image_extras", "sparkfold_image_published_supports"):
            kept[name] = tuple(str(item) for item in kept[name] or ())
        for name in ("sparkfold_image_series_ref", "sparkfold_engine_tensorfold"):
            kept[name] = dict(kept.get(name) or {})
        for name in names:
            if isinstance(kept[name], str):
                kept[name] = kept[name].strip()
            elif kept[name] is None:
                kept[name] = ""
        for name in ("sparkfold_image_base_digest_required", "sparkfold_image_docker_required"):
            kept[name] = _truthy(kept[name])
        return cls(**kept)

    @property
    def inventory_name(self) -> str:
        """``_sparkfold_inventory_name`` (roles/sparkfold/vars/main.yml): the inventory folder's name."""
        return Path(self.inventory_dir).name


def _truthy(value: Any) -> bool:
    """Ansible's ``| bool`` of a variable."""
    if isinstance(value, str):
        return value.strip().lower() in ("yes", "on", "1", "true", "y", "t")
    return bool(value)


@dataclass(frozen=True)
class Records:
    """The pins recorded on the control host, ``<control_dir>/pins/<inventory>/`` (the role's
    ``_sparkfold_image_pin_file``, ``_sparkfold_image_base_pin_file`` and
    ``_sparkfold_image_external_pin_file`` in vars/main.yml)."""

    folder: Path

    def commit_file(self, ref: str) -> Path:
        return self.folder / f"tensorfold-{ref}.commit"

    def base_file(self, base_name: str) -> Path:
        return self.folder / f"base-{re.sub(r'[/:]', '_', base_name)}.digest"

    def series_file(self, commit: str) -> Path:
        return self.folder / f"series-{commit}.yml"

    @staticmethod
    def text(path: Path) -> str:
        """A one-line record's value ('' when there is none), as the role reads it (slurp, trim)."""
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            return ""
        except OSError as exc:
            raise PlanError(f"cannot read the record {path}: {exc}") from None

    @staticmethod
    def series(path: Path) -> list[dict[str, str]]:
        """The recorded series files ``[{name, sha256}]`` (``pins.yml`` writes them as YAML)."""
        text = Records.text(path)
        try:
            found = yaml.safe_load(text) if text else []
        except yaml.YAMLError as exc:
            raise PlanError(f"the record {path} is not YAML: {exc}") from None
        if not isinstance(found, list):
            raise PlanError(f"the record {path} is not a list of {{name, sha256}}")
        return [{"name": str(f.get("name", "")), "sha256": str(f.get("sha256", ""))} for f in found]


@dataclass(frozen=True)
class NodeFacts:
    """What the role's probes found on a node (tasks/docker.yml)."""

    docker: bool = True
    problem: str = ""
    series_label: str = ""
    """``org.sparkfold.tensorfold.series`` of ``sparkfold_image_name`` ('' without the image)."""
    tf_patches: str = ""
    """The recipe's ``tf.patches`` label of ``sparkfold_image_name``."""
    repo_digests: tuple[str, ...] = ()


@dataclass(frozen=True)
class Probe:
    """This run's facts: every node's, the series hash (``sparkfold image hash``) and what the head
    resolved now (the tag's commit, the pulled base's digest, the fetched series' digests, the
    recipe's label of the fetched series)."""

    nodes: Mapping[str, NodeFacts] = field(default_factory=dict)
    head: str = ""
    hash: str = ""
    tag_commit: str = ""
    tag_problem: str = ""
    tag_probed: bool = False
    """The head ran ``git ls-remote`` (tasks/tag.yml); ``tag_problem`` says why it gave no commit."""
    base_digest: str = ""
    fetched: Mapping[str, str] = field(default_factory=dict)
    """The external series' verified files, in order: name to sha256."""
    fetch_probed: bool = False
    fetch_ok: bool = False
    fetch_problem: str = ""
    """Why ``sparkfold image fetch`` refused the series (its words; read where ``fetch_ok`` is false)."""
    recipe_label: str | None = None
    """The recipe's ``tf.patches`` label the head computed over the fetched series (None: not asked)."""
    to_record: tuple[Kind, ...] | None = None
    """What this run's first plan said it resolves and records: a plan again keeps it, so a pin
    recorded earlier in the run is still one this run records (None: decide from the records)."""

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Probe:
        """From decided facts (``sparkfold image plan --probe FILE``, by hand)."""
        nodes = {
            str(name): NodeFacts(
                docker=_truthy(facts.get("docker", True)),
                problem=str(facts.get("problem", "")),
                series_label=str(facts.get("series_label", "")).strip(),
                tf_patches=str(facts.get("tf_patches", "")).strip(),
                repo_digests=tuple(str(d) for d in facts.get("repo_digests") or ()),
            )
            for name, facts in (values.get("nodes") or {}).items()
        }
        return cls(
            nodes=nodes,
            head=str(values.get("head") or next(iter(nodes), "")),
            hash=str(values.get("hash", "")),
            tag_commit=str(values.get("tag_commit", "")),
            tag_probed="tag_commit" in values,
            base_digest=str(values.get("base_digest", "")),
            fetched={str(k): str(v) for k, v in (values.get("fetched") or {}).items()},
            fetch_probed="fetched" in values,
            fetch_ok="fetched" in values,
            recipe_label=str(values["recipe_label"]) if "recipe_label" in values else None,
        )

    @classmethod
    def from_results(cls, results: Mapping[str, Any]) -> Probe:
        """From the role's probe results as Ansible registered them (``--results``, tasks/plan.yml):
        ``head``, ``hash`` (the one this run computed, if any), ``docker`` and ``label`` (each
        node's ``docker version`` and series label probe, by node), and the head's ``tag``
        (git ls-remote), ``fetch`` (sparkfold image fetch), ``base`` (the pulled base's
        RepoDigests) and ``recipe_label`` (sparkfold image label); :mod:`sparkfold.image.probes`
        reads each."""
        docker = results.get("docker") or {}
        labels = results.get("label") or {}
        nodes = {
            str(name): NodeFacts(
                docker=probes.docker_answers(found),
                problem=probes.docker_problem(found),
                series_label=probes.text(labels.get(name)),
            )
            for name, found in docker.items()
            if probes.ran(found)
        }
        tag, fetch, label = results.get("tag"), results.get("fetch"), results.get("recipe_label")
        return cls(
            nodes=nodes,
            head=str(results.get("head", "")),
            hash=str(results.get("hash") or ""),
            tag_commit=probes.tag_commit(tag) if probes.ran(tag) else "",
            tag_problem=probes.tag_problem(tag) if probes.ran(tag) else "",
            tag_probed=probes.ran(tag),
            base_digest=probes.pulled_digest(results.get("base")),
            fetched={f["name"]: f["sha256"] for f in probes.fetched_files(fetch)},
            fetch_probed=probes.ran(fetch),
            fetch_ok=probes.ran(fetch) and (fetch or {}).get("rc") == 0,
            fetch_problem=probes.fetch_problem(fetch) if probes.ran(fetch) else "",
            recipe_label=str(probes.json_field(label, "value", "")) if probes.ran(label) else None,
            to_record=tuple(results["to_record"]) if results.get("to_record") is not None else None,
        )


@dataclass(frozen=True)
class Pin:
    """One pinned value: what it pins (``kind``: image, commit, base or series; ``name``: the ref,
    the base image's name or the series file), its value, where it came from and its record file.

    ``record`` is true when the value was resolved now and must be written to ``record_file``.
    """

    kind: Kind
    name: str
    value: str
    source: Source
    record_file: str
    record: bool = False

    @property
    def what(self) -> str:
        """In words: ``tensorfold v0.6.0``, ``base nvcr.io/...``, ``series 0001-x.patch``, ``image``."""
        return " ".join(filter(None, ("tensorfold" if self.kind == "commit" else self.kind, self.name)))


@dataclass(frozen=True)
class NodeState:
    """A node as planned: its currency (``state``, ``why``), whether Docker answers there (and why
    not), and whether its image carries the series hash this run computed (``current``: the role
    builds or copies only where it does not)."""

    node: str
    state: Currency
    why: str
    docker: bool = True
    problem: str = ""
    series_label: str = ""
    current: bool = False


@dataclass(frozen=True)
class Found:
    """What a probe on the head found, decided: a value ('' without one), whether the probe ran,
    whether it succeeded, and why not in words."""

    value: str = ""
    probed: bool = False
    ok: bool = False
    problem: str = ""


@dataclass(frozen=True)
class HashInputs:
    """What the series hash covers beside our series (``sparkfold image hash``'s options): the base
    in effect, or a ready context folder (its files' digest stands for base and commit); the ref
    (``ref@commit`` for a TensorFold build); the extras; the external series' verified files."""

    ref: str
    base: str = ""
    context: str = ""
    extras: tuple[str, ...] = ()
    external_source: str = ""
    external_strip: int = 0
    external: tuple[tuple[str, str], ...] = ()


Hasher = Callable[[HashInputs], str]


@dataclass(frozen=True)
class ImagePlan:
    way: Way
    source: str
    image: str
    pins: tuple[Pin, ...]
    nodes: tuple[NodeState, ...]
    profile_name: str
    supports: tuple[str, ...]
    stop: str | None
    stops: Mapping[str, str] = field(default_factory=dict)
    """Every stop that applies, keyed as :data:`STOPS` (``stop`` is the first): the role asserts
    each where it meets it, so a run stops after the same steps as before, in these words."""
    warnings: Mapping[str, str] = field(default_factory=dict)
    """What the role warns about when it goes on: ``base_unpinned`` (the base is a tag)."""
    record_files: Mapping[str, str] = field(default_factory=dict)
    """Where each kind of pin this way has is recorded on the control host (commit, base, series),
    also where no pin of that kind is known yet (a series whose files are not listed nor recorded)."""
    to_record: tuple[Kind, ...] = ()
    """The kinds of pin this run resolves on the head and records (trust on first use, through
    roles/sparkfold/tasks/pins.yml): neither the inventory nor a record pins them (a series: some
    file, or no file is known yet)."""
    label: str = LABEL
    """The image label that carries the series hash."""
    head_docker: bool = False
    """Docker answers on the head (as probed; false before the probe)."""
    build_due: bool = False
    """The head has Docker and its image does not carry the series hash: a build (or pull) is due."""
    tag: Found = field(default_factory=Found)
    """The tag's commit as the head resolved it now (tasks/tag.yml); ``ok``: a full commit."""
    fetch: Found = field(default_factory=Found)
    """The external series' fetch on the head (tasks/series.yml); its files are ``fetched``."""
    fetched: tuple[Mapping[str, str], ...] = ()
    """The external series' verified files, in order (``[{name, sha256}]``, as recorded)."""
    external_source: str = ""
    """The external series as ``repo@commit:folder`` ('' without one)."""
    commit: str = ""
    """The TensorFold commit a build clones: the pinned one, else the tag's now ('' unknown)."""
    base: str = ""
    """The base image a build starts FROM: by digest when pinned or pulled now, else the tag."""
    pinned_ref: str = ""
    """The ref the series hash covers: ``ref@commit`` for a TensorFold build, else the ref."""
    hash: str = ""
    """The series hash the image must carry (computed when asked: ``--hash``)."""
    published_label: str = ""
    """The ``tf.patches`` label a published image is accepted by: the recipe's formula over the
    fetched series when the head computed it, else ``sparkfold_image_published_label``."""

    def pin(self, kind: Kind) -> Pin | None:
        """The one pin of ``kind`` (image, commit or base), if the way has it."""
        return next((p for p in self.pins if p.kind == kind), None)

    def as_dict(self) -> dict[str, Any]:
        """The plan as ``sparkfold image plan --json`` gives it: also each pin in words (``what``),
        ``pinned``, the pins by kind (image, commit, base: one or null; series: a list), and
        ``node``, the nodes by name."""
        found = asdict(self)
        for pin, given in zip(self.pins, found["pins"], strict=True):
            given["what"] = pin.what
        found["pinned"] = {
            kind: next((p for p in found["pins"] if p["kind"] == kind), None)
            for kind in ("image", "commit", "base")
        }
        found["pinned"]["series"] = [p for p in found["pins"] if p["kind"] == "series"]
        found["node"] = {node["node"]: node for node in found["nodes"]}
        return found


def plan(
    values: ImageVars,
    records: Records,
    probe: Probe | None = None,
    *,
    series_supports: Sequence[str] = (),
    hasher: Hasher | None = None,
) -> ImagePlan:
    """The image stage's plan for ``values``; ``series_supports`` is what our own series' profile.toml
    declares (``sparkfold image hash --json``'s ``supports``). With ``hasher`` (and a probe without
    a hash), the series hash of the inputs in effect is computed (:class:`HashInputs`)."""
    probed = probe is not None
    probe = probe or Probe()
    way = _way(values)
    if way == "none":
        return ImagePlan(way, "", values.sparkfold_image_name, (), (), "", (), None)
    pins = _pins(values, records, probe, way)
    commit_pin = next((p for p in pins if p.kind == "commit"), None)
    base_pin = next((p for p in pins if p.kind == "base"), None)
    commit = commit_pin.value if commit_pin else ""
    ref = values.sparkfold_image_tensorfold_ref
    fetched = tuple({"name": name, "sha256": sha} for name, sha in probe.fetched.items())
    inputs = HashInputs(
        ref=f"{ref}@{commit}" if commit_pin else ref,
        base=f"{base_pin.name}@{base_pin.value}"
        if base_pin and base_pin.value
        else values.sparkfold_image_base,
        context=values.sparkfold_image_context_dir if values.sparkfold_image_source == "context" else "",
        extras=() if values.sparkfold_image_source == "context" else values.sparkfold_image_extras,
        external_source=_external_source(values) if fetched else "",
        external_strip=int(values.sparkfold_image_series_ref.get("strip", 0)),
        external=tuple((f["name"], f["sha256"]) for f in fetched),
    )
    if not probe.hash and hasher is not None:
        probe = replace(probe, hash=hasher(inputs))
    nodes = tuple(_node(values, probe, way, name, facts) for name, facts in probe.nodes.items())
    head = next((n for n in nodes if n.node == probe.head), None)
    stops = _stops(values, records, probe, way, pins, head, probed=probed)
    return ImagePlan(
        way=way,
        source="registry" if way == "published" else values.sparkfold_image_source,
        image=values.sparkfold_image_name,
        pins=tuple(pins),
        nodes=nodes,
        profile_name=_profile_name(values),
        supports=_supports(values, series_supports),
        stop=next(iter(stops.values()), None),
        stops=stops,
        warnings=_warnings(values, way),
        record_files=_record_files(values, records, way),
        to_record=_to_record(values, pins) if probe.to_record is None else probe.to_record,
        head_docker=head is not None and head.docker,
        build_due=head is not None and head.docker and not head.current,
        tag=Found(
            probe.tag_commit,
            probe.tag_probed,
            bool(_COMMIT.match(probe.tag_commit)),
            probe.tag_problem,
        ),
        fetch=Found("", probe.fetch_probed, probe.fetch_ok, probe.fetch_problem),
        fetched=fetched,
        external_source=_external_source(values),
        commit=commit,
        base=inputs.base,
        pinned_ref=inputs.ref,
        hash=probe.hash,
        published_label=probe.recipe_label or values.sparkfold_image_published_label,
    )


def _external_source(values: ImageVars) -> str:
    """The external series in words: ``repo@commit:folder`` ('' without one)."""
    series = values.sparkfold_image_series_ref
    if not series:
        return ""
    return f"{series.get('repo', '')}@{series.get('commit', '')}:{series.get('folder', 'patches')}"


def _way(values: ImageVars) -> Way:
    """tasks/main.yml: skip.yml when the engine is not tensorfold; pull.yml when
    ``sparkfold_image_registry_ref`` is set; build.yml otherwise (series.yml with a series ref)."""
    if values.sparkfold_engine != "tensorfold":
        return "none"
    if values.sparkfold_image_registry_ref:
        return "published"
    if values.sparkfold_image_series_ref or values.sparkfold_image_source == "context":
        return "build"
    return "stock"


def _pinned(kind: Kind, name: str, inventory: str, recorded: str, now: str, record_file: Path) -> Pin:
    """Trust on first use (recorded through roles/sparkfold/tasks/pins.yml): the inventory's value,
    else the recorded one, else the one resolved now (to be recorded)."""
    if inventory:
        return Pin(kind, name, inventory, "inventory", str(record_file))
    if recorded:
        return Pin(kind, name, recorded, "recorded", str(record_file))
    if now:
        return Pin(kind, name, now, "resolved-now", str(record_file), record=True)
    return Pin(kind, name, "", "unresolved", str(record_file))


def _base_name(values: ImageVars) -> str:
    """``_sparkfold_image_base_name`` (vars/main.yml)."""
    return values.sparkfold_image_base.split("@")[0]


def _base_inventory_digest(values: ImageVars) -> str:
    """``_sparkfold_image_base_inventory_digest`` (vars/main.yml)."""
    return ([*values.sparkfold_image_base.split("@"), ""])[1]


def _series_commit(values: ImageVars) -> str:
    return str(values.sparkfold_image_series_ref.get("commit", ""))


def _pins(values: ImageVars, records: Records, probe: Probe, way: Way) -> list[Pin]:
    pins: list[Pin] = []
    if way == "published":
        pins.append(Pin("image", "", values.sparkfold_image_registry_ref, "inventory", ""))
    # tasks/main.yml: pin.yml and base.yml run for a git source without a registry ref.
    if way != "published" and values.sparkfold_image_source == "git":
        ref = values.sparkfold_image_tensorfold_ref
        commit_file = records.commit_file(ref)
        pins.append(
            _pinned(
                "commit",
                ref,
                values.sparkfold_image_tensorfold_commit,
                Records.text(commit_file) if not values.sparkfold_image_tensorfold_commit else "",
                probe.tag_commit,
                commit_file,
            )
        )
        base_file = records.base_file(_base_name(values))
        pins.append(
            _pinned(
                "base",
                _base_name(values),
                _base_inventory_digest(values),
                Records.text(base_file),
                probe.base_digest,
                base_file,
            )
        )
    # tasks/main.yml: series.yml runs whenever a series is referenced (also for a published image).
    if values.sparkfold_image_series_ref:
        series_file = records.series_file(_series_commit(values))
        recorded = {f["name"]: f["sha256"] for f in Records.series(series_file)}
        listed = list(values.sparkfold_image_series_ref.get("files") or [])
        # vars/main.yml _sparkfold_image_external_names: the inventory's files, else the recorded.
        names = [str(f["name"]) for f in listed] or list(recorded) or list(probe.fetched)
        given = {str(f["name"]): str(f.get("sha256") or "") for f in listed}
        for name in names:
            pins.append(
                _pinned(
                    "series",
                    name,
                    given.get(name, ""),
                    recorded.get(name, ""),
                    probe.fetched.get(name, ""),
                    series_file,
                )
            )
    return pins


def _stops(
    values: ImageVars,
    records: Records,
    probe: Probe,
    way: Way,
    pins: Sequence[Pin],
    head: NodeState | None,
    *,
    probed: bool,
) -> dict[str, str]:
    """Every stop that applies, in the order the role meets them, with its words (:data:`STOPS`)."""
    stops: dict[str, str] = {}
    for node, facts in probe.nodes.items():
        if values.sparkfold_image_docker_required and not facts.docker and "docker" not in stops:
            stops["docker"] = STOPS["docker"].format(node=node, problem=facts.problem or "no answer")
    source = values.sparkfold_image_source
    if not (
        source == "git"
        or (
            source == "context"
            and values.sparkfold_image_context_dir
            and not values.sparkfold_image_registry_ref
        )
    ):
        stops["source"] = STOPS["source"].format(source=source)
    if way != "published" and source == "git":
        base = values.sparkfold_image_base
        if "@" in base and not _DIGEST.match(base):
            stops["base_malformed"] = STOPS["base_malformed"].format(base=base)
        if values.sparkfold_image_base_digest_required and "@sha256:" not in base:
            stops["base_unpinned"] = _unpinned_base(values)
        inventory, recorded = (
            _base_inventory_digest(values),
            Records.text(records.base_file(_base_name(values))),
        )
        if inventory and recorded not in ("", inventory):
            stops["base_mismatch"] = STOPS["base_mismatch"].format(
                inventory=inventory,
                recorded=recorded,
                name=_base_name(values),
                record=records.base_file(_base_name(values)),
            )
    engine_image = values.sparkfold_engine_tensorfold.get("image")
    registry = values.sparkfold_image_registry_ref
    if (engine_image or values.sparkfold_image_name) != values.sparkfold_image_name or (
        registry and not _PUBLISHED.search(registry)
    ):
        stops["settings"] = STOPS["settings"].format(
            engine_image=engine_image or "unset", name=values.sparkfold_image_name, registry_ref=registry
        )
    # tasks/pull.yml, where the head has Docker (or nothing is known of the nodes): the label to accept
    # by is the recipe's over the fetched series when the head computed it, else the inventory's. With
    # a series, it is known once the head has fetched it and computed the label (or fetched nothing).
    head_docker = head.docker if head is not None else not probe.nodes
    label = probe.recipe_label or values.sparkfold_image_published_label
    label_known = not values.sparkfold_image_series_ref or (
        probed and (probe.recipe_label is not None or not probe.fetched)
    )
    if way == "published" and head_docker and label_known and len(label) != 12:
        stops["published_label"] = STOPS["published_label"].format(registry_ref=registry)
    # tasks/build.yml re-checks the tag only where the head's image is due for a build.
    head_due = head is not None and head.state in ("stale", "missing")
    commit = next((p for p in pins if p.kind == "commit"), None)
    if commit and probe.tag_commit and head_due and commit.value and commit.value != probe.tag_commit:
        given = values.sparkfold_image_tensorfold_commit
        stops["tag_moved"] = STOPS["tag_moved"].format(
            ref=values.sparkfold_image_tensorfold_ref,
            repo=values.sparkfold_image_tensorfold_repo,
            now=probe.tag_commit,
            pinned=commit.value,
            where="sparkfold_image_tensorfold_commit" if given else commit.record_file,
            delete="" if given else f" (and delete {commit.record_file})",
        )
    return stops


def _record_files(values: ImageVars, records: Records, way: Way) -> dict[str, str]:
    found: dict[str, str] = {}
    if way != "published" and values.sparkfold_image_source == "git":
        found["commit"] = str(records.commit_file(values.sparkfold_image_tensorfold_ref))
        found["base"] = str(records.base_file(_base_name(values)))
    if values.sparkfold_image_series_ref:
        found["series"] = str(records.series_file(_series_commit(values)))
    return found


def _to_record(values: ImageVars, pins: Sequence[Pin]) -> tuple[Kind, ...]:
    held = ("inventory", "recorded")
    kinds: list[Kind] = [p.kind for p in pins if p.kind in ("commit", "base") and p.source not in held]
    series = [p for p in pins if p.kind == "series"]
    if values.sparkfold_image_series_ref and (not series or any(p.source not in held for p in series)):
        kinds.append("series")
    return tuple(kinds)


def _unpinned_base(values: ImageVars) -> str:
    return STOPS["base_unpinned"].format(base=values.sparkfold_image_base, inventory_dir=values.inventory_dir)


def _warnings(values: ImageVars, way: Way) -> dict[str, str]:
    """tasks/base.yml warns, with the stop's words, when the base the build uses is a tag."""
    if (
        way != "published"
        and values.sparkfold_image_source == "git"
        and "@" not in values.sparkfold_image_base
    ):
        return {"base_unpinned": _unpinned_base(values)}
    return {}


def _node(values: ImageVars, probe: Probe, way: Way, node: str, facts: NodeFacts) -> NodeState:
    """A node as planned. ``current``: its image carries the series hash (the role builds, copies to
    the worker, and says "current" by it, also where it pulls a published image)."""
    state, why = _currency(values, probe, way, facts)
    current = facts.docker and bool(probe.hash) and facts.series_label == probe.hash
    return NodeState(node, state, why, facts.docker, facts.problem, facts.series_label, current)


def _currency(values: ImageVars, probe: Probe, way: Way, facts: NodeFacts) -> tuple[Currency, str]:
    """Whether a node's image is the one planned: its series label against the series hash for a
    build; for a published image, ``sparkfold.image.published.pull_published``'s rule (its
    tf.patches label and digest)."""
    name = values.sparkfold_image_name
    if not facts.docker:
        return ("missing", f"no working Docker ({facts.problem or 'no answer'})")
    if way == "published":
        digest = values.sparkfold_image_registry_ref.rsplit("@", 1)[-1]
        expected = values.sparkfold_image_published_label
        if not facts.tf_patches and not facts.repo_digests:
            return ("missing", f"no image {name}")
        if not any(d.endswith("@" + digest) for d in facts.repo_digests):
            return ("stale", f"{name} is not {digest}")
        if values.sparkfold_image_series_ref:
            return ("unknown", "the label is the recipe's formula over the series, fetched on the head")
        if facts.tf_patches != expected:
            return ("stale", f"{name} carries tf.patches={facts.tf_patches or '(none)'}, not {expected}")
        return ("current", f"{name} is {digest} with tf.patches={expected}")
    if not facts.series_label:
        return ("missing", f"no image {name}")
    if not probe.hash:
        return ("unknown", "no series hash given (sparkfold image hash)")
    if facts.series_label != probe.hash:
        return ("stale", f"{name} was built from another series ({facts.series_label})")
    return ("current", f"{name} carries the series hash {probe.hash}")


def _profile_name(values: ImageVars) -> str:
    """``_sparkfold_image_profile_name`` (vars/main.yml)."""
    name = values.sparkfold_image_name
    if values.sparkfold_image_registry_ref:
        return f"{name} (published {values.sparkfold_image_registry_ref})"
    if values.sparkfold_image_source == "context":
        return f"{name} (the ready context {Path(values.sparkfold_image_context_dir).name})"
    ref = values.sparkfold_image_tensorfold_ref
    external = f" + {_external_source(values)}" if values.sparkfold_image_series_ref else ""
    return f"{name} (TensorFold {ref}{external} + patches/tensorfold/{ref})"


def _supports(values: ImageVars, series_supports: Sequence[str]) -> tuple[str, ...]:
    """``_sparkfold_image_supports`` (vars/main.yml): ours, the external series', the published image's."""
    found = [*series_supports, *(values.sparkfold_image_series_ref.get("supports") or [])]
    if values.sparkfold_image_registry_ref:
        found += values.sparkfold_image_published_supports
    return tuple(sorted(set(map(str, found))))
