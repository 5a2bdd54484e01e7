"""The image a build replaces stays under a rollback tag (``<name>-previous``); pruning superseded
images is opt-in. The image role on this host against the fake ``docker`` (tests/ansible/fakes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_image_role import IMAGE, label, pair, play, recap, tensorfold

__all__ = ["pair", "tensorfold"]  # the fixtures this module uses

EXTRAS = ("-e", '{"sparkfold_image_extras": ["av==18.1.0"]}')  # another series hash: a rebuild


def previous(pair: Path) -> str | None:
    image = pair / "docker" / f"image-{IMAGE.replace(':', '_')}-previous"
    return image.read_text().strip() if image.exists() else None


@pytest.mark.slow
def test_a_rebuild_keeps_the_replaced_image_under_its_rollback_tag(repo: Path, pair: Path) -> None:
    assert play(repo, pair).returncode == 0
    first = label(pair)
    assert previous(pair) is None  # nothing was replaced
    rebuilt = play(repo, pair, *EXTRAS)
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert label(pair) not in (None, first)
    assert previous(pair) == first
    again = play(repo, pair, *EXTRAS)
    assert again.returncode == 0 and "changed=0" in recap(again), again.stdout
    assert previous(pair) == first
    assert "image prune" not in (pair / "docker/calls").read_text()  # pruning is opt-in


@pytest.mark.slow
def test_pruning_superseded_images_is_opt_in_and_keeps_the_rollback(repo: Path, pair: Path) -> None:
    assert play(repo, pair).returncode == 0
    pruned = play(repo, pair, *EXTRAS, "-e", "sparkfold_image_prune_enabled=true")
    assert pruned.returncode == 0, pruned.stdout + pruned.stderr
    calls = (pair / "docker/calls").read_text()
    assert "image prune --force --filter label=org.sparkfold.tensorfold.series" in calls
    assert previous(pair) is not None and label(pair) is not None
