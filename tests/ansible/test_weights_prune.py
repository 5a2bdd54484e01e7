"""Pruning superseded weights is opt-in: the Hub source on this host (the fake Hub, tests/ansible/
test_weights_role.py's fixtures) with an older revision of the model beside the pinned one."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_weights_role import DRAFTER, DRAFTER_COMMIT, MODEL, MODEL_COMMIT, head, hub, play, store

__all__ = ["head", "hub"]  # the fixtures this module uses

OLD = "f" * 40


def old_revision(head: Path) -> Path:
    old = store(head, MODEL, OLD)
    old.mkdir(parents=True)
    (old / "model.safetensors").write_bytes(b"the checkpoint a new pin replaced")
    old.with_name(f"{OLD}.manifest.json").write_text("{}\n")
    return old


@pytest.mark.slow
def test_superseded_revisions_stay_unless_pruning_is_enabled(repo: Path, head: Path) -> None:
    old = old_revision(head)
    kept = play(repo, head)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert old.is_dir()
    pruned = play(repo, head, "-e", "sparkfold_weights_prune_enabled=true")
    assert pruned.returncode == 0, pruned.stdout + pruned.stderr
    assert not old.exists() and not old.with_name(f"{OLD}.manifest.json").exists()
    assert (store(head, MODEL, MODEL_COMMIT) / "config.json").is_file()
    assert store(head, MODEL, MODEL_COMMIT).with_name(f"{MODEL_COMMIT}.manifest.json").is_file()
    assert (store(head, DRAFTER, DRAFTER_COMMIT) / "model.safetensors").is_file()
