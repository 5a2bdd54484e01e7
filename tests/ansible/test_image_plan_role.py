"""`sparkfold image plan` decides what the image role decides, for the shipped inventories.

Each inventory's image variables are rendered through the precedence the role sees (its defaults,
the inventory, extra vars) by render_image.yml, together with the `when:` of every task file that
roles/sparkfold_image/tasks/main.yml includes (read from that file here, evaluated by Ansible) and
the record files vars/main.yml derives; the planner, given the same variables, must choose the same
way and pins. Nothing connects to the inventories' hosts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from local_head import ansible

from sparkfold.image.plan import ImageVars, Plan, Records, plan

# inventory/example/group_vars/all/image.yml's second way, as an operator uncomments it.
SERIES_BUILD = {
    "sparkfold_image_registry_ref": "",
    "sparkfold_image_tensorfold_ref": "v0.6.6",
    "sparkfold_image_tensorfold_commit": "cb2ebf0540f42604e2759b2ddef497861e928248",
    "sparkfold_image_base": "nvcr.io/nvidia/pytorch:26.07-py3@sha256:" + "1" * 64,
    "sparkfold_image_series_ref": {
        "repo": "https://github.com/MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks-TensorFold.git",
        "commit": "3ddadccaa907fa4a0697bc59862c67250293b1cd",
        "folder": "patches/v066",
        "files": [{"name": "0001-glm-recipe-compat.patch", "sha256": ""}],
        "supports": ["parallel", "kv_fp8"],
    },
}
# The example's other ways as hosts of a second inventory source beside it: its group_vars/all
# apply to them too, and their host vars override it as an operator's edit of image.yml would.
VARIANTS = {
    "example-stock": {"sparkfold_image_registry_ref": ""},
    "example-series": SERIES_BUILD,
}
# Each inventory's arguments, and the ways the role takes on its hosts (the testbed's tensorfold kind
# pulls the stand-in published on the control host, or builds stock TensorFold before it is published).
INVENTORIES: dict[str, tuple[tuple[str, ...], dict[str, set[str]]]] = {
    "example": (
        ("inventory/example", "-i", "VARIANTS"),
        {
            "spark-head": {"published"},
            "spark-worker": {"published"},
            "example-stock": {"stock"},
            "example-series": {"build"},
        },
    ),
    "testbed": (("inventory/testbed",), {"": {"none"}}),
    "testbed-tensorfold": (
        ("inventory/testbed", "-e", "@inventory/testbed-tensorfold.yml"),
        {"": {"published", "stock"}},
    ),
}


def variants(folder: Path) -> Path:
    """The second inventory source of :data:`VARIANTS` (local hosts in sparkfold_nodes)."""
    hosts = {name: {"ansible_connection": "local", **values} for name, values in VARIANTS.items()}
    path = folder / "variants" / "hosts.yml"
    path.parent.mkdir()
    path.write_text(json.dumps({"sparkfold_nodes": {"hosts": hosts}}))
    return path


def conditions(repo: Path) -> dict[str, str]:
    """Each task file tasks/main.yml includes, and its `when:` as one Jinja expression."""
    found: dict[str, str] = {}
    for task in yaml.safe_load((repo / "roles/sparkfold_image/tasks/main.yml").read_text()):
        included = task.get("ansible.builtin.import_tasks") or task["ansible.builtin.include_tasks"]["file"]
        when = task["when"] if isinstance(task["when"], list) else [task["when"]]
        found[included] = "{{ " + " and ".join(f"({c})" for c in when) + " }}"
    return found


def render(repo: Path, folder: Path, inventory: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    names = [name for name in ImageVars.__dataclass_fields__ if name.startswith("sparkfold_image_")]
    names.append("sparkfold_engine")
    extra = folder / "render.json"
    extra.write_text(
        json.dumps({"render_dir": str(folder), "render_names": names, "render_when": conditions(repo)})
    )
    sources = [str(variants(folder)) if arg == "VARIANTS" else arg for arg in inventory]
    result = ansible(
        repo, "ansible-playbook", "-i", *sources, "tests/ansible/render_image.yml", "-e", f"@{extra}"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return {
        path.stem: json.loads(path.read_text())
        for path in folder.glob("*.json")
        if path.name != "render.json"
    }


def role_way(when: dict[str, str]) -> set[str]:
    """The ways the role's task files allow (build.yml serves both a series build and the stock one)."""

    def on(name: str) -> bool:
        return str(when[name]).strip().lower() == "true"

    if on("skip.yml"):
        return {"none"}
    return {"published"} if on("pull.yml") else {"build", "stock"} if on("build.yml") else set()


@pytest.mark.parametrize("name", sorted(INVENTORIES))
def test_the_planner_decides_as_the_role_does(repo: Path, tmp_path: Path, name: str) -> None:
    arguments, expected = INVENTORIES[name]
    rendered = render(repo, tmp_path, arguments)
    assert rendered, "no host rendered"
    assert set(expected) <= {"", *rendered}, rendered.keys()
    # The variants see the example's image.yml (its image name) under their own edits.
    names = {role["vars"]["sparkfold_image_name"] for role in rendered.values()}
    assert len(names) == 1, names
    for host, role in rendered.items():
        ways = expected.get(host) or expected[""]
        values = ImageVars.from_mapping(role["vars"])
        records = Records(Path(role["vars"]["sparkfold_control_dir"]) / "pins" / values.inventory_name)
        done: Plan = plan(values, records)
        when = {key: str(value).strip().lower() == "true" for key, value in role["when"].items()}
        assert done.way in role_way(role["when"]) & ways, (host, done.way, role["when"])
        pinned = {p.what.split()[0]: p for p in done.pins}
        assert ("tensorfold" in pinned) == when["pin.yml"], (host, done.pins)
        assert ("base" in pinned) == when["base.yml"], (host, done.pins)
        assert any(w == "series" for w in pinned) <= when["series.yml"], (host, done.pins)
        if when["pin.yml"]:
            assert pinned["tensorfold"].record_file == role["derived"]["pin_file"]
        if when["base.yml"]:
            assert pinned["base"].record_file == role["derived"]["base_pin_file"]
            inventory_digest = role["derived"]["base_inventory_digest"]
            assert (pinned["base"].source == "inventory") == bool(inventory_digest)
        if any(w == "series" for w in pinned):
            assert {p.record_file for p in done.pins if p.what.startswith("series ")} == {
                role["derived"]["external_pin_file"]
            }
        if done.way != "none":
            assert done.profile_name == role["derived"]["profile_name"]
        if (
            values.sparkfold_image_base_digest_required
            and when["base.yml"]
            and "@" not in values.sparkfold_image_base
        ):
            assert done.stop == role["derived"]["unpinned_base"]
