"""inventory/example serves the reference recipe's engine by default (issue #28).

Over the example's rendered variables only (nothing connects to its hosts): the image stage pulls
the recipe's published image by digest from GitHub's container registry, as a reference `docker
pull` takes it, and accepts it by its tf.patches label; both ranks run it with the recipe's
settings, which the image's profile allows; more than the profile allows is refused at config
check, naming the setting. Values from /work/shared/reference/recipe.md §1.1 and §7.2.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from sparkfold.config import Settings, load
from sparkfold.engines.tensorfold.launch import FabricFacts
from sparkfold.engines.tensorfold.profile import ImageProfile, load_profile, refusals
from sparkfold.node.tensorfold_rank import plan_for

RECIPE_IMAGE = "ghcr.io/miaai-lab/glm-5.3-flash-exl3-2x-dgx-sparks-tensorfold"
RECIPE_TAG = "v0.6.0-a1897d591f70"
RECIPE_DIGEST = "sha256:bc34d7d63f978cf601f42863b284bc95a567c50c10e9adb0866a635be568bf5f"
DRAFTER = ("incoai/GLM-5.3-Flash-DFlash2", "bf582e4eacc1810f76656d1811693ff6c6737d2a")
NODES = ("spark-head", "spark-worker")
# Docker's reference grammar (distribution/reference): host[:port]/path[:tag]@sha256:<64 hex>,
# path components lower case.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"^(?P<host>[a-zA-Z0-9.-]+(?::\d+)?)/(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?@(?P<digest>sha256:[0-9a-f]{64})$"
)


def fetched(example_render: Path, node: str) -> dict[str, Any]:
    return dict(json.loads((example_render / node / "fetched.json").read_text()))


def image_profile(repo: Path, example_render: Path, tmp_path: Path) -> ImageProfile:
    """The profile the image stage writes for the example: our series' (patches/tensorfold/<ref>/
    profile.toml) and the published image's declared supports (roles/sparkfold_image/vars)."""
    ours = tomllib.loads((repo / "patches/tensorfold/v0.6.0/profile.toml").read_text())["supports"]
    published = fetched(example_render, "spark-head")["image"]["published_supports"]
    path = tmp_path / "tensorfold-image.toml"
    path.write_text(f'image = "the example\'s image"\nsupports = {json.dumps(sorted({*ours, *published}))}\n')
    return load_profile(path)


def settings(example_render: Path, node: str) -> Settings:
    return load(example_render / node / "sparkfold.toml")


def test_the_example_pulls_the_recipes_published_image_by_digest(repo: Path, example_render: Path) -> None:
    for node in NODES:
        image = fetched(example_render, node)["image"]
        ref = _REFERENCE.match(image["registry_ref"])
        assert ref, f"{image['registry_ref']!r} is not a reference docker pull accepts"
        assert f"{ref['host']}/{ref['path']}" == RECIPE_IMAGE
        assert (ref["tag"], ref["digest"]) == (RECIPE_TAG, RECIPE_DIGEST)
        # Accepted by the label its tag names, and run under the local tag the engine names.
        assert image["published_label"] == RECIPE_TAG.rsplit("-", 1)[1]
        assert settings(example_render, node).engine.tensorfold.image == image["name"]
    example = "".join(path.read_text() for path in (repo / "inventory/example").rglob("*.yml"))
    assert "REGISTRY" not in example and "<digest>" not in example.replace("@sha256:<digest>", "")


def test_both_ranks_run_the_recipes_engine_flags(example_render: Path) -> None:
    facts = FabricFacts("enp1s0f1np1", ("rocep1s0f1", "roceP2p1s0f1"), 3)
    drafter = "/var/lib/sparkfold/models/{}/{}".format(*DRAFTER)
    for node in NODES:
        plan = plan_for(settings(example_render, node), facts=facts)
        argv = " ".join(plan.argv)
        command = " ".join(plan.command)
        assert "sparkfold-tensorfold:v0.6.0-recipe" in plan.argv, argv
        assert "--parallel 4" in command and "--context 1048576" in command, command
        assert "--vision" in plan.command and f"--drafter {drafter}" in command, command
        assert plan.rank_env["TF_GLM_KV"] == "fp8" and plan.rank_env["TF_GLM_DENSE"] == "q4"
        assert plan.rank_env["TENSORFOLD_GLM_MAX_IMAGES"] == "50"
        assert plan.rank_env["TF_GLM_CACHE_ENTRIES"] == "32"


def test_the_drafter_is_fetched_at_its_pin(example_render: Path) -> None:
    for node in NODES:
        assert tuple(fetched(example_render, node)["drafter"].values()) == DRAFTER


def test_the_published_images_profile_allows_the_examples_settings(
    repo: Path, example_render: Path, tmp_path: Path
) -> None:
    profile = image_profile(repo, example_render, tmp_path)
    for node in NODES:
        assert refusals(settings(example_render, node), profile) == []
    head = settings(example_render, "spark-head")
    assert (head.api.max_images, head.api.max_image_mib, head.api.max_videos) == (50, 10, 4)


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ('kv_tier_gib = 64\nkv_tier_dir = "/var/lib/sparkfold/kv"', "engine.tensorfold.kv_tier_gib = 64"),
        ("peer_timeout_s = 180", "engine.tensorfold.peer_timeout_s = 180"),
    ],
)
def test_more_than_the_published_image_allows_is_refused_at_config_check(
    repo: Path, example_render: Path, tmp_path: Path, setting: str, named: str
) -> None:
    """Release v1.10 has neither the NVMe KV tier nor the engine's peer watch (recipe.md §1.2):
    `sparkfold config check` refuses them on the example's head, naming the setting."""
    profile = image_profile(repo, example_render, tmp_path)
    rendered = (example_render / "spark-head/sparkfold.toml").read_text()
    asking = tmp_path / "asking.toml"
    asking.write_text(rendered.replace("[engine.tensorfold]\n", f"[engine.tensorfold]\n{setting}\n", 1))
    argv = [sys.executable, "-c", "from sparkfold.cli import main; main()", "config", "check", str(asking)]
    env = {**os.environ, "PYTHONPATH": str(repo / "runtime")}
    refused = subprocess.run(
        [*argv, "--image-profile", str(profile.path)], capture_output=True, text=True, env=env
    )
    assert refused.returncode != 0 and named in refused.stdout + refused.stderr, refused
    fine = subprocess.run(
        [*argv[:-1], str(example_render / "spark-head/sparkfold.toml"), "--image-profile", str(profile.path)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert fine.returncode == 0, fine
