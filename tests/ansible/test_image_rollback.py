"""A failed build leaves the image in use; the image a build replaces stays under a rollback tag
(``<name>-previous``); pruning superseded images is opt-in. The image role on this host against the
fake ``docker`` (tests/ansible/fakes)."""

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
def test_a_failed_build_keeps_the_image_and_a_rebuild_keeps_it_under_its_rollback_tag(
    repo: Path, pair: Path
) -> None:
    """One pair through a build, a failed build, a rebuild, a re-run and an opt-in prune."""
    assert play(repo, pair).returncode == 0
    first = label(pair)
    assert previous(pair) is None  # nothing was replaced

    failed = play(repo, pair, *EXTRAS, FAKE_BUILD_FAIL="1")
    assert failed.returncode != 0
    assert "previous image (if any) is unchanged" in failed.stdout
    assert "patch 0007-window.patch does not apply" in failed.stdout
    assert label(pair) == first and previous(pair) is None
    assert not (pair / "docker" / f"image-{IMAGE.replace(':', '_')}-building").exists()

    rebuilt = play(repo, pair, *EXTRAS)
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert label(pair) not in (None, first)
    assert previous(pair) == first
    again = play(repo, pair, *EXTRAS)
    assert again.returncode == 0 and "changed=0" in recap(again), again.stdout
    assert previous(pair) == first
    assert "image prune" not in (pair / "docker/calls").read_text()  # pruning is opt-in

    pruned = play(repo, pair, *EXTRAS, "-e", "sparkfold_image_prune_enabled=true")
    assert pruned.returncode == 0, pruned.stdout + pruned.stderr
    calls = (pair / "docker/calls").read_text()
    assert "image prune --force --filter label=org.sparkfold.tensorfold.series" in calls
    assert previous(pair) == first and label(pair) is not None


DIGEST = "a" * 64


@pytest.mark.slow
def test_the_base_image_is_pinned_by_digest_or_the_run_says_how(repo: Path, pair: Path) -> None:
    required = ("-e", "sparkfold_image_base_digest_required=true")
    refused = play(repo, pair, *required)
    assert refused.returncode != 0 and label(pair) is None
    words = " ".join(refused.stdout.split())
    assert "is the tag nvcr.io/nvidia/pytorch:26.07-py3, not a digest" in words
    assert "index .RepoDigests 0" in words
    pinned = f"sparkfold_image_base=nvcr.io/nvidia/pytorch:26.07-py3@sha256:{DIGEST}"
    built = play(repo, pair, *required, "-e", pinned)
    assert built.returncode == 0, built.stdout + built.stderr
    assert (
        f"FROM nvcr.io/nvidia/pytorch:26.07-py3@sha256:{DIGEST}"
        in (pair / "cache/image-build/Dockerfile").read_text()
    )
    malformed = play(repo, pair, "-e", "sparkfold_image_base=nvcr.io/nvidia/pytorch@sha256:123")
    assert (
        malformed.returncode != 0
        and "a digest is written NAME:TAG@sha256:<64 hex digits>" in malformed.stdout
    )
