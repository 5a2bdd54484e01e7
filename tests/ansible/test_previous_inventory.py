"""The previous release's example inventory against today's roles: an upgrade keeps the user's
inventory, so every variable it sets (or lists at its default) is still a knob, or is named in the
preflight stage's table of removed variables, whose stop says what to set instead; and what it
renders passes today's settings schema (``sparkfold.config.load``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from local_head import ansible, render_example
from test_ansible import ROLES
from tests.releases import Release, previous_release, write_tree

from sparkfold.config import load

EXAMPLE = "inventory/example"
VARIABLE = re.compile(r"^\s*#?\s*(sparkfold_[a-z0-9_]+):")


@pytest.fixture(scope="module")
def release(repo: Path) -> Release:
    found = previous_release(repo)
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture(scope="module")
def previous_example(repo: Path, release: Release, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's inventory/example, as the repository holds it (``git archive``)."""
    return write_tree(repo, release, tmp_path_factory.mktemp("previous"), EXAMPLE) / EXAMPLE


def removed(repo: Path) -> dict[str, str]:
    """The preflight stage's table: removed variable -> what to set instead."""
    table = yaml.safe_load((repo / "roles/sparkfold_preflight/vars/main.yml").read_text())
    return dict(table["_sparkfold_preflight_removed_vars"])


def host_variables(group: dict) -> set[str]:
    """The sparkfold_* variables an inventory's hosts.yml sets on its hosts and groups."""
    found: set[str] = set()
    for members in (group or {}).values():
        for host in (members.get("hosts") or {}).values():
            found |= {key for key in host or {} if key.startswith("sparkfold_")}
        found |= {key for key in members.get("vars") or {} if key.startswith("sparkfold_")}
        found |= host_variables(members.get("children") or {})
    return found


def test_every_variable_of_the_previous_example_is_a_knob_or_named_as_removed(
    repo: Path, previous_example: Path
) -> None:
    variables = {
        match[1]
        for path in (previous_example / "group_vars").rglob("*.yml")
        for line in path.read_text().splitlines()
        if (match := VARIABLE.match(line))
    } | host_variables(yaml.safe_load((previous_example / "hosts.yml").read_text()))
    knobs = {
        name
        for role in ROLES
        for name in yaml.safe_load((repo / "roles" / role / "defaults/main.yml").read_text()) or {}
    }
    per_host = {"sparkfold_fabric_address"}  # each node's own (hosts.yml), no default
    unknown = sorted(variables - knobs - per_host - removed(repo).keys())
    assert not unknown, (
        f"the previous release's {EXAMPLE} sets {unknown}, which today's roles neither know nor name: add "
        "each renamed or removed one to _sparkfold_preflight_removed_vars with what to set instead"
    )


def test_a_removed_variable_stops_the_run_naming_its_replacement(repo: Path) -> None:
    name, instead = next(iter(removed(repo).items()))
    result = ansible(repo, "ansible-playbook", "-i", EXAMPLE, "playbooks/preflight.yml", "-e", f"{name}=x")
    assert result.returncode != 0
    said = " ".join(result.stdout.split())
    assert f"{name} was removed: set {instead} instead" in said
    assert "UNREACHABLE" not in said, "the stop came after a node was reached"


def test_the_previous_example_renders_settings_that_validate_today(
    repo: Path, previous_example: Path, tmp_path: Path
) -> None:
    rendered = render_example(repo, tmp_path / "render", inventory=str(previous_example))
    hosts = sorted(path.parent.name for path in rendered.glob("*/sparkfold.toml"))
    assert hosts == ["spark-head", "spark-worker"]
    for host in hosts:
        load(rendered / host / "sparkfold.toml")  # raises, naming the key, on a setting it refuses
