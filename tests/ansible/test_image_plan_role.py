"""The image role carries out `sparkfold image plan`, for the shipped inventories.

render_image.yml runs the role's own plan task (roles/sparkfold_image/tasks/plan.yml) on each
inventory, hosts not connected to, and writes its plan beside the image variables as the role sees
them (its defaults, the inventory, extra vars): the plan the role got is the planner's for those
variables (what the role passes loses nothing), its way is one the role has a task file for
(tasks/main.yml includes way-<way>.yml), and it is the way each inventory means.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from local_head import ansible

from sparkfold.image.plan import ImageVars, Records, plan

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


def render(repo: Path, folder: Path, inventory: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    names = [name for name in ImageVars.__dataclass_fields__ if name.startswith("sparkfold_image_")]
    names.append("sparkfold_engine")
    extra = folder / "render.json"
    extra.write_text(json.dumps({"render_dir": str(folder / "render"), "render_names": names}))
    sources = [str(variants(folder)) if arg == "VARIANTS" else arg for arg in inventory]
    result = ansible(
        repo, "ansible-playbook", "-i", *sources, "tests/ansible/render_image.yml", "-e", f"@{extra}"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return {path.stem: json.loads(path.read_text()) for path in (folder / "render").glob("*.json")}


@pytest.mark.parametrize("name", sorted(INVENTORIES))
def test_the_role_carries_out_the_planners_plan(repo: Path, tmp_path: Path, name: str) -> None:
    arguments, expected = INVENTORIES[name]
    rendered = render(repo, tmp_path, arguments)
    assert rendered, "no host rendered"
    assert set(expected) <= {"", *rendered}, rendered.keys()
    # The variants see the example's image.yml (its image name) under their own edits.
    names = {role["vars"]["sparkfold_image_name"] for role in rendered.values()}
    assert len(names) == 1, names
    for host, role in rendered.items():
        got = role["plan"]
        assert got["way"] in (expected.get(host) or expected[""]), (host, got["way"])
        assert (repo / f"roles/sparkfold_image/tasks/way-{got['way']}.yml").is_file(), got["way"]
        values = ImageVars.from_mapping(role["vars"])
        records = Records(Path(role["vars"]["sparkfold_control_dir"]) / "pins" / values.inventory_name)
        ours = plan(values, records, series_supports=supports(values, Path(role["series"]))).as_dict()
        assert got == json.loads(json.dumps(ours)), host
        if got["way"] == "none":
            continue
        # What the role reads of the plan (tasks/*.yml) is there for every way it takes.
        assert got["profile_name"].startswith(values.sparkfold_image_name + " ("), got["profile_name"]
        assert set(got["pinned"]) == {"image", "commit", "base", "series"}, got["pinned"]
        assert set(got["to_record"]) <= set(got["record_files"]), got


def supports(values: ImageVars, series: Path) -> list[str]:
    """What our series' profile.toml supports, or a ready context's (as `sparkfold image plan` reads it)."""
    from sparkfold.engines.tensorfold.profile import load_profile

    context = values.sparkfold_image_source == "context" and values.sparkfold_image_context_dir
    profile = (Path(context) if context else series.parent) / "profile.toml"
    return sorted(load_profile(profile).supports) if profile.exists() else []
