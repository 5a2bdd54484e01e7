"""The image stage's plan (sparkfold.image.plan): the way, trust-on-first-use pins and the stops, as
the role decides them (roles/sparkfold_image/tasks/main.yml, pin.yml, base.yml, series.yml)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from sparkfold.cli import main
from sparkfold.image.plan import STOPS, ImagePlan, ImageVars, PlanError, Probe, Records, plan

COMMIT = "a" * 40
OTHER_COMMIT = "b" * 40
DIGEST = "sha256:" + "1" * 64
OTHER_DIGEST = "sha256:" + "2" * 64
PUBLISHED = f"registry.example/tf:v0.6.0-a1897d591f70@{DIGEST}"
BASE = "nvcr.io/nvidia/pytorch:26.07-py3"
SERIES = {
    "repo": "https://git.example/series.git",
    "commit": "c" * 40,
    "folder": "patches",
    "supports": ["vision"],
}


def role_defaults(repo: Path) -> dict[str, Any]:
    """The role's defaults, as the role sees them before the inventory (Jinja-valued ones left out)."""
    found = yaml.safe_load((repo / "roles/sparkfold_image/defaults/main.yml").read_text())
    return {name: value for name, value in found.items() if "{{" not in str(value)}


def plan_of(repo: Path, tmp_path: Path, probe: dict[str, Any] | None = None, **inventory: Any) -> ImagePlan:
    values = ImageVars.from_mapping(
        {**role_defaults(repo), "sparkfold_engine": "tensorfold", "inventory_dir": "/inv/pair", **inventory}
    )
    return plan(values, Records(tmp_path / "pins"), Probe.from_mapping(probe) if probe else None)


def pin(done: ImagePlan, what: str) -> Any:
    return next(p for p in done.pins if p.what.startswith(what))


def test_the_venv_engines_have_no_image(repo: Path, tmp_path: Path) -> None:
    done = plan_of(repo, tmp_path, sparkfold_engine="transformers", sparkfold_image_registry_ref=PUBLISHED)
    assert (done.way, done.pins, done.stop) == ("none", (), None)


def test_a_published_image_is_pulled_by_digest_and_nothing_is_pinned_for_a_build(
    repo: Path, tmp_path: Path
) -> None:
    done = plan_of(
        repo, tmp_path, sparkfold_image_registry_ref=PUBLISHED, sparkfold_image_published_label="a" * 12
    )
    assert done.way == "published" and done.stop is None
    assert [(p.what, p.value, p.source) for p in done.pins] == [("image", PUBLISHED, "inventory")]
    assert done.profile_name.endswith(f"(published {PUBLISHED})")


def test_a_series_reference_builds_and_its_files_are_pinned(repo: Path, tmp_path: Path) -> None:
    files = [{"name": "0001.patch", "sha256": "d" * 64}, {"name": "0002.patch", "sha256": ""}]
    done = plan_of(repo, tmp_path, sparkfold_image_series_ref={**SERIES, "files": files})
    assert done.way == "build"
    first, second = pin(done, "series 0001"), pin(done, "series 0002")
    assert (first.value, first.source) == ("d" * 64, "inventory")
    assert (second.value, second.source) == ("", "unresolved")
    assert second.record_file == str(tmp_path / "pins" / f"series-{'c' * 40}.yml")
    assert "vision" in done.supports


def test_stock_tensorfold_is_the_opt_out_without_registry_or_series(repo: Path, tmp_path: Path) -> None:
    done = plan_of(repo, tmp_path, sparkfold_image_tensorfold_commit=COMMIT)
    assert done.way == "stock" and done.stop is None
    assert (pin(done, "tensorfold").value, pin(done, "tensorfold").source) == (COMMIT, "inventory")
    assert done.profile_name == "sparkfold-tensorfold:v0.6.0 (TensorFold v0.6.0 + patches/tensorfold/v0.6.0)"


def test_a_ready_context_is_built_as_it_is(repo: Path, tmp_path: Path) -> None:
    done = plan_of(
        repo, tmp_path, sparkfold_image_source="context", sparkfold_image_context_dir="/ctx/standin"
    )
    assert (done.way, done.source, done.pins) == ("build", "context", ())


@pytest.mark.parametrize(
    ("inventory", "stop"),
    [
        ({"sparkfold_image_source": "context"}, "source"),
        (
            {
                "sparkfold_image_source": "context",
                "sparkfold_image_context_dir": "/c",
                "sparkfold_image_registry_ref": PUBLISHED,
            },
            "source",
        ),
        ({"sparkfold_image_base": "nvcr.io/nvidia/pytorch:26.07-py3@sha256:12"}, "base_malformed"),
        ({"sparkfold_image_base_digest_required": True}, "base_unpinned"),
        ({"sparkfold_engine_tensorfold": {"image": "other:tag"}}, "settings"),
        ({"sparkfold_image_registry_ref": "registry.example/tf:v1"}, "settings"),
        ({"sparkfold_image_registry_ref": PUBLISHED}, "published_label"),
    ],
)
def test_the_refusals_say_the_roles_words(
    repo: Path, tmp_path: Path, inventory: dict[str, Any], stop: str
) -> None:
    done = plan_of(repo, tmp_path, **inventory)
    head = STOPS[stop].split("{", 1)[0]
    assert done.stop is not None and done.stop.startswith(head), done.stop
    assert "{" not in done.stop.replace("{{index", ""), done.stop


def test_the_unpinned_base_stop_says_how_to_find_the_digest(repo: Path, tmp_path: Path) -> None:
    done = plan_of(repo, tmp_path, sparkfold_image_base_digest_required=True)
    assert done.stop == (
        f"sparkfold_image_base is the tag {BASE}, not a digest: a rebuild would take "
        f"whatever it points to then. On the head: docker pull {BASE} && docker image "
        f"inspect --format '{{{{index .RepoDigests 0}}}}' {BASE}; then set in "
        "/inv/pair/group_vars/all/image.yml sparkfold_image_base: "
        f'"{BASE}@sha256:<that digest>"'
    )


def record(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / "pins" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return path


def test_the_inventory_beats_the_record(repo: Path, tmp_path: Path) -> None:
    record(tmp_path, "tensorfold-v0.6.0.commit", OTHER_COMMIT)
    done = plan_of(repo, tmp_path, sparkfold_image_tensorfold_commit=COMMIT)
    assert (pin(done, "tensorfold").value, pin(done, "tensorfold").source) == (COMMIT, "inventory")


def test_the_record_holds_when_the_inventory_is_silent(repo: Path, tmp_path: Path) -> None:
    commit_file = record(tmp_path, "tensorfold-v0.6.0.commit", OTHER_COMMIT)
    base_file = record(tmp_path, "base-nvcr.io_nvidia_pytorch_26.07-py3.digest", DIGEST)
    series_file = record(
        tmp_path, f"series-{'c' * 40}.yml", yaml.safe_dump([{"name": "0001.patch", "sha256": "e" * 64}])
    )
    done = plan_of(
        repo, tmp_path, {"tag_commit": COMMIT, "base_digest": OTHER_DIGEST}, sparkfold_image_series_ref=SERIES
    )
    assert [(p.value, p.source, p.record_file, p.record) for p in done.pins] == [
        (OTHER_COMMIT, "recorded", str(commit_file), False),
        (DIGEST, "recorded", str(base_file), False),
        ("e" * 64, "recorded", str(series_file), False),
    ]


def test_neither_pins_what_the_head_resolved_now_and_records_it(repo: Path, tmp_path: Path) -> None:
    probe = {"tag_commit": COMMIT, "base_digest": DIGEST, "fetched": {"0001.patch": "f" * 64}}
    done = plan_of(repo, tmp_path, probe, sparkfold_image_series_ref=SERIES)
    assert [(p.value, p.source, p.record) for p in done.pins] == [
        (COMMIT, "resolved-now", True),
        (DIGEST, "resolved-now", True),
        ("f" * 64, "resolved-now", True),
    ]
    unresolved = plan_of(repo, tmp_path)
    assert [(p.source, p.record) for p in unresolved.pins] == [("unresolved", False)] * 2


def test_an_inventory_base_digest_unlike_the_record_stops(repo: Path, tmp_path: Path) -> None:
    base_file = record(tmp_path, "base-nvcr.io_nvidia_pytorch_26.07-py3.digest", OTHER_DIGEST)
    done = plan_of(repo, tmp_path, sparkfold_image_base=f"nvcr.io/nvidia/pytorch:26.07-py3@{DIGEST}")
    assert done.stop == (
        f"sparkfold_image_base pins {DIGEST}, but this control host recorded {OTHER_DIGEST} for "
        f"{BASE} when it first used it ({base_file}): copy the recorded one into the "
        f'inventory (sparkfold_image_base: "{BASE}@{OTHER_DIGEST}"), or, if the new '
        "digest is meant (a newer base), delete that file and run again"
    )


def test_a_moved_tag_stops_a_due_build_and_not_a_current_image(repo: Path, tmp_path: Path) -> None:
    commit_file = record(tmp_path, "tensorfold-v0.6.0.commit", COMMIT)
    probe: dict[str, Any] = {"head": "h1", "hash": "9" * 64, "tag_commit": OTHER_COMMIT}
    stale = plan_of(repo, tmp_path, {**probe, "nodes": {"h1": {"series_label": "8" * 64}}})
    assert stale.stop is not None and stale.stop.startswith("the tag moved: v0.6.0 of ")
    assert stale.stop.endswith(
        f'sparkfold_image_tensorfold_commit: "{OTHER_COMMIT}" (and delete {commit_file})'
    )
    assert [(n.node, n.state) for n in stale.nodes] == [("h1", "stale")]
    current = plan_of(repo, tmp_path, {**probe, "nodes": {"h1": {"series_label": "9" * 64}}})
    assert current.stop is None and current.nodes[0].state == "current"


def test_published_currency_is_the_digest_and_label(repo: Path, tmp_path: Path) -> None:
    nodes = {
        "h1": {"tf_patches": "a" * 12, "repo_digests": [f"registry.example/tf@{DIGEST}"]},
        "w1": {"tf_patches": "a" * 12, "repo_digests": [f"registry.example/tf@{OTHER_DIGEST}"]},
        "w2": {},
        "w3": {"docker": False, "problem": "no daemon"},
    }
    done = plan_of(
        repo,
        tmp_path,
        {"nodes": nodes},
        sparkfold_image_registry_ref=PUBLISHED,
        sparkfold_image_published_label="a" * 12,
        sparkfold_image_docker_required=False,
    )
    assert [n.state for n in done.nodes] == ["current", "stale", "missing", "missing"]
    required = plan_of(repo, tmp_path, {"nodes": nodes}, sparkfold_image_registry_ref=PUBLISHED)
    assert required.stop == STOPS["docker"].format(node="w3", problem="no daemon")


def test_what_is_not_pinned_is_resolved_and_recorded_where_the_plan_says(repo: Path, tmp_path: Path) -> None:
    """The role resolves on the head, and records through roles/sparkfold/tasks/pins.yml, the kinds
    in ``to_record``; a series with no file known yet is one of them."""
    fresh = plan_of(repo, tmp_path, sparkfold_image_series_ref=SERIES)
    pins = tmp_path / "pins"
    assert fresh.to_record == ("commit", "base", "series")
    assert fresh.record_files == {
        "commit": str(pins / "tensorfold-v0.6.0.commit"),
        "base": str(pins / "base-nvcr.io_nvidia_pytorch_26.07-py3.digest"),
        "series": str(pins / f"series-{'c' * 40}.yml"),
    }
    record(tmp_path, "tensorfold-v0.6.0.commit", COMMIT)
    listed = {**SERIES, "files": [{"name": "0001.patch", "sha256": "d" * 64}]}
    held = plan_of(repo, tmp_path, sparkfold_image_base=f"{BASE}@{DIGEST}", sparkfold_image_series_ref=listed)
    assert held.to_record == ()
    half = {**SERIES, "files": [{"name": "0001.patch", "sha256": "d" * 64}, {"name": "0002.patch"}]}
    assert plan_of(repo, tmp_path, sparkfold_image_series_ref=half).to_record == ("base", "series")
    published = plan_of(
        repo, tmp_path, sparkfold_image_registry_ref=PUBLISHED, sparkfold_image_series_ref=SERIES
    )
    assert (published.to_record, set(published.record_files)) == (("series",), {"series"})


def test_every_stop_that_applies_is_keyed_and_the_first_is_the_stop(repo: Path, tmp_path: Path) -> None:
    """The role asserts each stop where it meets it: all that apply are in ``stops``, in its order."""
    done = plan_of(
        repo,
        tmp_path,
        sparkfold_image_base_digest_required=True,
        sparkfold_engine_tensorfold={"image": "other:tag"},
    )
    assert list(done.stops) == ["base_unpinned", "settings"] and done.stop == done.stops["base_unpinned"]
    assert done.warnings == {"base_unpinned": done.stops["base_unpinned"]}
    assert plan_of(repo, tmp_path, sparkfold_image_base=f"{BASE}@{DIGEST}").warnings == {}


def test_the_json_names_each_pin_by_kind(repo: Path, tmp_path: Path) -> None:
    files = [{"name": "0001.patch", "sha256": "d" * 64}]
    found = plan_of(
        repo,
        tmp_path,
        sparkfold_image_tensorfold_commit=COMMIT,
        sparkfold_image_series_ref={**SERIES, "files": files},
    ).as_dict()
    assert found["pinned"]["image"] is None
    assert (found["pinned"]["commit"]["value"], found["pinned"]["commit"]["what"]) == (
        COMMIT,
        "tensorfold v0.6.0",
    )
    assert (found["pinned"]["base"]["name"], found["pinned"]["base"]["source"]) == (BASE, "unresolved")
    assert [(p["name"], p["value"]) for p in found["pinned"]["series"]] == [("0001.patch", "d" * 64)]


def test_a_ready_contexts_profile_is_its_own(repo: Path, tmp_path: Path) -> None:
    """As `image hash --context`: the context's profile.toml, not the one beside our series."""
    context = tmp_path / "standin"
    context.mkdir()
    (context / "profile.toml").write_text('image = "the stand-in"\nsupports = ["vision"]\n')
    values = tmp_path / "vars.json"
    values.write_text(
        json.dumps(
            {
                **role_defaults(repo),
                "sparkfold_engine": "tensorfold",
                "sparkfold_image_source": "context",
                "sparkfold_image_context_dir": str(context),
                "sparkfold_control_dir": str(tmp_path),
            }
        )
    )
    series = str(repo / "patches/tensorfold/v0.6.0/series")
    args = ["image", "plan", "--json", "--inventory-vars", str(values), "--series", series]
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["supports"] == ["vision"]


def test_a_missing_variable_is_named(repo: Path) -> None:
    with pytest.raises(PlanError, match="sparkfold_image_base"):
        ImageVars.from_mapping({"sparkfold_engine": "tensorfold"})


def test_the_command_prints_the_plan(repo: Path, tmp_path: Path) -> None:
    values = tmp_path / "vars.json"
    values.write_text(
        json.dumps(
            {
                **role_defaults(repo),
                "sparkfold_engine": "tensorfold",
                "sparkfold_image_base_digest_required": True,
                "sparkfold_control_dir": str(tmp_path),
                "inventory_dir": "/inv/pair",
            }
        )
    )
    runner = CliRunner()
    as_json = runner.invoke(main, ["image", "plan", "--json", "--inventory-vars", str(values)])
    assert as_json.exit_code == 1, as_json.output
    found = json.loads(as_json.output)
    assert found["way"] == "stock" and found["stop"].startswith("sparkfold_image_base is the tag")
    assert found["pins"][0]["record_file"] == str(tmp_path / "pins/pair/tensorfold-v0.6.0.commit")
    series = str(repo / "patches/tensorfold/v0.6.0/series")
    text = runner.invoke(
        main,
        ["image", "plan", "--inventory-vars", str(values), "--records", str(tmp_path), "--series", series],
    )
    assert "way: stock (git)" in text.output and "stop: sparkfold_image_base is the tag" in text.output
    broken = tmp_path / "broken.json"
    broken.write_text("[1, 2]")
    for option in ("--inventory-vars", "--probe"):
        args = ["image", "plan", "--inventory-vars", str(values), option, str(broken)]
        refused = runner.invoke(main, args)
        assert refused.exit_code == 1 and f"{option} {broken}: not a mapping" in refused.output, (
            refused.output
        )
    silent = tmp_path / "silent.json"
    silent.write_text(json.dumps({"sparkfold_engine": "tensorfold"}))
    lacking = runner.invoke(main, ["image", "plan", "--inventory-vars", str(silent)])
    assert lacking.exit_code == 1 and "the image variables lack sparkfold_image_name" in lacking.output


# The stops the role asserts with the plan's words (task file, task name) ...
PLANNED = {
    "source": ("tasks/source.yml", "Stop if the image source is not usable"),
    "base_malformed": ("tasks/base.yml", "Stop if the base image's digest is malformed"),
    "base_unpinned": ("tasks/base.yml", "Stop if the base image must be pinned by digest and is not"),
    "base_mismatch": (
        "tasks/base.yml",
        "Stop if the inventory's base digest is not the one recorded at first use",
    ),
    "settings": ("tasks/hash.yml", "Stop if the image settings do not fit together"),
    "published_label": ("tasks/pull.yml", "Stop if there is no label to accept the published image by"),
    "tag_moved": ("tasks/build.yml", "Stop if the tag moved away from the pinned commit"),
}
# ... and the one it words itself, node by node, with the plan's reading of the node's Docker probe.
ROLE_WORDS = {
    "docker": ("tasks/docker.yml", "Stop if Docker does not answer on a node that must run the engine image"),
}
_JINJA = re.compile(r"\{\{(?:'[^']*'|\"[^\"]*\"|[^'\"])*?\}\}")


def role_assert(repo: Path, file: str, name: str) -> dict[str, Any]:
    tasks = list(yaml.safe_load((repo / "roles/sparkfold_image" / file).read_text()))
    while tasks:
        task = tasks.pop()
        tasks += task.get("block", []) + task.get("rescue", [])
        if task.get("name") == name:
            return dict(task["ansible.builtin.assert"])
    raise AssertionError(f"no task {name!r} in {file}")


def test_every_stop_is_the_plans_or_worded_by_the_role() -> None:
    assert set(PLANNED) | set(ROLE_WORDS) == set(STOPS) and not set(PLANNED) & set(ROLE_WORDS)


@pytest.mark.parametrize("stop", sorted(PLANNED))
def test_the_role_stops_with_the_plans_words(repo: Path, stop: str) -> None:
    """The role asserts the plan's stop where it met it before, and prints the plan's words."""
    task = role_assert(repo, *PLANNED[stop])
    assert task["that"] == f"_sparkfold_image_plan.stops.{stop} is not defined", task
    assert task["fail_msg"] == f"{{{{ _sparkfold_image_plan.stops.{stop} | default('') }}}}", task


@pytest.mark.parametrize("stop", sorted(ROLE_WORDS))
def test_the_stops_keep_the_roles_words(repo: Path, stop: str) -> None:
    """Every literal run of the role's message appears, in order, in the planner's (the role's Jinja
    fields are the planner's format fields)."""
    role = " ".join(str(role_assert(repo, *ROLE_WORDS[stop])["fail_msg"]).split())
    ours = " ".join(STOPS[stop].split())
    at = 0
    for literal in (part.strip() for part in _JINJA.split(role)):
        found = ours.find(literal, at) if literal else at
        assert found >= 0, f"{stop}: {literal!r} is not in {ours[at:]!r}"
        at = found + len(literal)


# --- A plan again after the role's probes (--results: their results as Ansible registered them)


def results(**found: Any) -> dict[str, Any]:
    """The role's probe results (tasks/plan.yml) on one head h1 whose Docker answers."""
    return {
        "head": "h1",
        "docker": {"h1": {"rc": 0, "stdout": "28.1.1"}},
        "label": {"h1": {"rc": 0, "stdout": "9" * 64 + "\n"}},
        **found,
    }


def replan(repo: Path, tmp_path: Path, found: dict[str, Any], **inventory: Any) -> ImagePlan:
    values = ImageVars.from_mapping(
        {**role_defaults(repo), "sparkfold_engine": "tensorfold", "inventory_dir": "/inv/pair", **inventory}
    )
    return plan(values, Records(tmp_path / "pins"), Probe.from_results(found))


def test_each_nodes_docker_and_currency_come_from_its_probes(repo: Path, tmp_path: Path) -> None:
    found = results(
        hash="9" * 64,
        docker={
            "h1": {"rc": 0, "stdout": "28.1.1"},
            "w1": {"rc": 2, "stderr": "", "msg": "[Errno 2] No such file or directory: b'docker'"},
            "w2": {"rc": 0, "stdout": "28.1.1"},
        },
        label={"h1": {"rc": 0, "stdout": "9" * 64}, "w1": {"skipped": True}, "w2": {"rc": 1, "stdout": ""}},
    )
    done = replan(repo, tmp_path, found, sparkfold_image_docker_required=False).as_dict()
    head, worker, other = done["node"]["h1"], done["node"]["w1"], done["node"]["w2"]
    assert (head["docker"], head["current"], head["state"]) == (True, True, "current")
    assert (worker["docker"], worker["problem"], worker["current"]) == (
        False,
        "docker is not installed (not on PATH)",
        False,
    )
    assert (other["series_label"], other["current"], other["state"]) == ("", False, "missing")
    assert (done["head_docker"], done["build_due"]) == (True, False)
    stale = replan(repo, tmp_path, results(hash="8" * 64))
    assert (stale.head_docker, stale.build_due, stale.nodes[0].state) == (True, True, "stale")
    # Before the series hash is known, nothing is current, but the head's Docker is.
    early = replan(repo, tmp_path, results())
    assert (early.nodes[0].current, early.head_docker, early.nodes[0].series_label) == (False, True, "9" * 64)


def test_a_head_without_docker_builds_nothing(repo: Path, tmp_path: Path) -> None:
    found = results(hash="9" * 64, docker={"h1": {"rc": 1, "stderr": "Cannot connect"}}, label={})
    done = replan(repo, tmp_path, found, sparkfold_image_docker_required=False)
    assert (done.head_docker, done.build_due, done.nodes[0].problem) == (False, False, "Cannot connect")


def test_the_tag_the_head_resolved_is_pinned_and_said(repo: Path, tmp_path: Path) -> None:
    lines = [f"{OTHER_COMMIT}\trefs/tags/v0.6.0", f"{COMMIT}\trefs/tags/v0.6.0^{{}}"]
    done = replan(repo, tmp_path, results(tag={"rc": 0, "stdout_lines": lines, "stderr": ""}))
    assert (done.tag.value, done.tag.ok, done.tag.probed) == (COMMIT, True, True)
    assert (pin(done, "tensorfold").value, pin(done, "tensorfold").source) == (COMMIT, "resolved-now")
    assert (done.commit, done.pinned_ref) == (COMMIT, f"v0.6.0@{COMMIT}")
    missing = replan(repo, tmp_path, results(tag={"rc": 2, "stderr": "", "msg": "[Errno 2]"}))
    assert (missing.tag.ok, missing.tag.problem) == (False, "git is not installed (not on PATH)")
    assert (missing.commit, missing.pinned_ref) == ("", "v0.6.0@")
    skipped = replan(repo, tmp_path, results(tag={"skipped": True}))
    assert (skipped.tag.probed, skipped.tag.ok) == (False, False)


def test_a_moved_tag_stops_a_due_build_from_the_probes(repo: Path, tmp_path: Path) -> None:
    moved = {"rc": 0, "stdout_lines": [f"{OTHER_COMMIT}\trefs/tags/v0.6.0"], "stderr": ""}
    found = results(hash="8" * 64, tag=moved)
    done = replan(repo, tmp_path, found, sparkfold_image_tensorfold_commit=COMMIT)
    assert done.build_due and done.stops["tag_moved"].startswith(
        f"the tag moved: v0.6.0 of https://github.com/ashhart/TensorFold.git now points to {OTHER_COMMIT}, "
        f"not the pinned {COMMIT} (sparkfold_image_tensorfold_commit)"
    )
    current = replan(repo, tmp_path, {**found, "hash": "9" * 64}, sparkfold_image_tensorfold_commit=COMMIT)
    assert "tag_moved" not in current.stops


def test_the_base_in_effect_is_by_digest_when_pinned_or_pulled_now(repo: Path, tmp_path: Path) -> None:
    assert replan(repo, tmp_path, results()).base == BASE
    pulled = replan(repo, tmp_path, results(base={"rc": 0, "stdout": f"nvcr.io/nvidia/pytorch@{DIGEST}"}))
    assert (pulled.base, pin(pulled, "base").source) == (f"{BASE}@{DIGEST}", "resolved-now")
    record(tmp_path, "base-nvcr.io_nvidia_pytorch_26.07-py3.digest", OTHER_DIGEST)
    assert replan(repo, tmp_path, results()).base == f"{BASE}@{OTHER_DIGEST}"
    # A published image takes the base as written (no base is pinned for it).
    published = replan(repo, tmp_path, results(), sparkfold_image_registry_ref=PUBLISHED)
    assert (published.base, published.pinned_ref) == (BASE, "v0.6.0")


def fetch_result(*files: tuple[str, str]) -> dict[str, Any]:
    listed = [{"name": name, "sha256": sha} for name, sha in files]
    return {"rc": 0, "stdout": json.dumps({"ok": True, "files": listed}), "stderr": ""}


def test_the_fetched_series_is_pinned_in_order_and_a_refusal_said(repo: Path, tmp_path: Path) -> None:
    found = results(fetch=fetch_result(("0002.patch", "2" * 64), ("0001.patch", "1" * 64)))
    done = replan(repo, tmp_path, found, sparkfold_image_series_ref=SERIES)
    assert [dict(f) for f in done.fetched] == [
        {"name": "0002.patch", "sha256": "2" * 64},
        {"name": "0001.patch", "sha256": "1" * 64},
    ]
    assert (done.fetch.ok, done.external_source) == (True, f"{SERIES['repo']}@{'c' * 40}:patches")
    assert [(p.name, p.source) for p in done.pins if p.kind == "series"] == [
        ("0002.patch", "resolved-now"),
        ("0001.patch", "resolved-now"),
    ]
    refused = {"rc": 1, "stdout": "", "stderr": "Error: 0001.patch of x: not the pinned y\n"}
    bad = replan(repo, tmp_path, results(fetch=refused), sparkfold_image_series_ref=SERIES)
    assert (bad.fetch.probed, bad.fetch.ok, bad.fetch.problem, bad.fetched) == (
        True,
        False,
        "0001.patch of x: not the pinned y",
        (),
    )


def test_what_the_run_records_is_decided_by_its_first_plan(repo: Path, tmp_path: Path) -> None:
    """A pin recorded earlier in the run stays one the run records (the include of pins.yml and its
    handlers meet the same condition to the end)."""
    record(tmp_path, "base-nvcr.io_nvidia_pytorch_26.07-py3.digest", DIGEST)
    assert replan(repo, tmp_path, results()).to_record == ("commit",)
    kept = replan(repo, tmp_path, results(to_record=["commit", "base"]))
    assert kept.to_record == ("commit", "base")


def test_the_published_label_is_the_heads_else_the_inventorys(repo: Path, tmp_path: Path) -> None:
    published = {"sparkfold_image_registry_ref": PUBLISHED, "sparkfold_image_series_ref": SERIES}
    fetched = fetch_result(("0001.patch", "1" * 64))
    # Before the head computed it, a series' label is not known: no stop yet.
    waiting = replan(repo, tmp_path, results(fetch=fetched), **published)
    assert "published_label" not in waiting.stops and waiting.published_label == ""
    label = {"rc": 0, "stdout": json.dumps({"label": "tf.patches", "value": "a1897d591f70"})}
    done = replan(repo, tmp_path, results(fetch=fetched, recipe_label=label), **published)
    assert done.published_label == "a1897d591f70" and "published_label" not in done.stops
    # Nothing fetched (a check run on a head without git): the inventory's label, here none.
    unfetched = replan(repo, tmp_path, results(fetch={"skipped": True}), **published)
    assert unfetched.stops["published_label"] == STOPS["published_label"].format(registry_ref=PUBLISHED)
    given = replan(repo, tmp_path, results(), **published, sparkfold_image_published_label="0123456789ab")
    assert given.published_label == "0123456789ab" and "published_label" not in given.stops
    # A head without Docker pulls nothing: no label is needed.
    no_docker = results(docker={"h1": {"rc": 1, "stderr": "down"}})
    assert "published_label" not in replan(repo, tmp_path, no_docker, **published).stops


def hash_command(repo: Path, *args: str) -> str:
    series = str(repo / "patches/tensorfold/v0.6.0/series")
    done = CliRunner().invoke(main, ["image", "hash", "--json", "--series", series, *args])
    assert done.exit_code == 0, done.output
    return str(json.loads(done.output)["hash"])


def plan_command(repo: Path, tmp_path: Path, found: dict[str, Any], **inventory: Any) -> dict[str, Any]:
    values = tmp_path / "vars.json"
    values.write_text(
        json.dumps(
            {
                **role_defaults(repo),
                "sparkfold_engine": "tensorfold",
                "sparkfold_control_dir": str(tmp_path),
                **inventory,
            }
        )
    )
    series = str(repo / "patches/tensorfold/v0.6.0/series")
    args = ["image", "plan", "--json", "--inventory-vars", str(values), "--series", series, "--hash"]
    done = CliRunner().invoke(main, [*args, "--results", json.dumps(found)])
    assert done.exit_code in (0, 1), done.output
    return dict(json.loads(done.output))


def test_the_plan_hashes_the_pins_in_effect_as_image_hash_does(repo: Path, tmp_path: Path) -> None:
    extras = ["--extra=av==18.1.0", "--extra=xgrammar==0.2.8"]
    tag = {"rc": 0, "stdout_lines": [f"{COMMIT}\trefs/tags/v0.6.0"], "stderr": ""}
    pulled = {"rc": 0, "stdout": f"nvcr.io/nvidia/pytorch@{DIGEST}"}
    found = plan_command(repo, tmp_path, results(tag=tag, base=pulled))
    assert found["hash"] == hash_command(
        repo, "--ref", f"v0.6.0@{COMMIT}", "--base", f"{BASE}@{DIGEST}", *extras
    )
    assert found["node"]["h1"]["current"] is False
    # The external series' verified files join it.
    fetched = fetch_result(("0001.patch", "1" * 64))
    series = {**SERIES, "strip": 1}
    found = plan_command(repo, tmp_path, results(tag=tag, fetch=fetched), sparkfold_image_series_ref=series)
    assert found["hash"] == hash_command(
        repo,
        "--ref",
        f"v0.6.0@{COMMIT}",
        "--base",
        BASE,
        *extras,
        "--external-source",
        f"{SERIES['repo']}@{'c' * 40}:patches",
        "--external-strip",
        "1",
        f"--external=0001.patch={'1' * 64}",
    )
    # A ready context: its files stand for base and commit, no extras; the ref as written.
    context = tmp_path / "standin"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\n")
    found = plan_command(
        repo,
        tmp_path,
        results(),
        sparkfold_image_source="context",
        sparkfold_image_context_dir=str(context),
    )
    assert found["hash"] == hash_command(repo, "--ref", "v0.6.0", "--context", str(context))
    # A hash this run already computed is kept (the role passes it back).
    assert plan_command(repo, tmp_path, results(hash="7" * 64))["hash"] == "7" * 64


def test_results_and_probe_facts_are_one_or_the_other(repo: Path, tmp_path: Path) -> None:
    values = tmp_path / "vars.json"
    values.write_text(json.dumps({**role_defaults(repo), "sparkfold_engine": "tensorfold"}))
    args = ["image", "plan", "--inventory-vars", str(values), "--records", str(tmp_path)]
    both = CliRunner().invoke(main, [*args, "--probe", str(values), "--results", "{}"])
    assert both.exit_code == 2 and "not both" in both.output
    unhashed = CliRunner().invoke(main, [*args, "--hash"])
    assert unhashed.exit_code == 2 and "--hash needs --series" in unhashed.output
