"""The example inventory's reference to the recipe's series, as an operator uncomments it: a commit
(40 hex), a folder and an ordered file list the image role can fetch, a TensorFold ref sparkfold has
its own (empty) series and profile for, features the image profile knows, and the same commit in
docs/patches.md. Nothing here connects anywhere."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from sparkfold.engines.tensorfold.profile import FEATURES, load_profile
from sparkfold.image.external import parse_file_pin
from sparkfold.image.patches import read_series

IMAGE_YML = "inventory/example/group_vars/all/image.yml"


def recipe_block(repo: Path) -> dict[str, object]:
    """The commented recipe block of image.yml, uncommented: from its series reference (with the
    TensorFold ref it needs) to the extras line."""
    lines = (repo / IMAGE_YML).read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("# sparkfold_image_tensorfold_ref:"))
    last = next(i for i in range(first, len(lines)) if lines[i].startswith("# sparkfold_image_extras:"))
    text = "\n".join(line.removeprefix("# ") for line in lines[first : last + 1])
    block = yaml.safe_load(text)
    assert isinstance(block, dict)
    return block


def test_the_example_pins_the_recipe_series_at_a_commit_with_its_ordered_files(repo: Path) -> None:
    block = recipe_block(repo)
    ref = block["sparkfold_image_series_ref"]
    assert isinstance(ref, dict)
    assert re.fullmatch(r"[0-9a-f]{40}", ref["commit"]), "a full commit, never a tag"
    assert ref["repo"].endswith("MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks-TensorFold.git")
    assert ref["folder"] == "patches/v066" and ref["strip"] == 0
    pins = [parse_file_pin(f"{f['name']}={f.get('sha256') or ''}") for f in ref["files"]]
    assert [p.name for p in pins] == ["0001-glm-recipe-compat.patch"]
    assert set(ref["supports"]) <= set(FEATURES) and {"kv_tier", "peer_watch"}.isdisjoint(ref["supports"])
    assert ref["commit"] in (repo / "docs/patches.md").read_text()
    assert re.fullmatch(r"[0-9a-f]{40}", block["sparkfold_image_tensorfold_commit"])


def test_the_pinned_series_tensorfold_ref_has_our_own_series_and_profile(repo: Path) -> None:
    folder = repo / "patches/tensorfold" / recipe_block(repo)["sparkfold_image_tensorfold_ref"]
    assert read_series(folder / "series").patches == ()
    assert load_profile(folder / "profile.toml").supports == frozenset()
