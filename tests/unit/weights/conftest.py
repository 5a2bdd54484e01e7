"""Fixtures for the weights store: a fake Hugging Face Hub on loopback, and huggingface_hub kept off
the real Hub and the user's cache."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fakes"))

from fake_hub import FakeHub, FakeRepo
from weights_fakes import COMMIT, model_files


@pytest.fixture(autouse=True)
def _isolated_hub_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    # small read chunks, so a transfer cut after a few KiB has something to resume from
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 16 * 1024)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def repo() -> FakeRepo:
    return FakeRepo("acme/tiny-glm", model_files(), commit=COMMIT, branches={"main": COMMIT})


@pytest.fixture
def hub(repo: FakeRepo) -> Iterator[FakeHub]:
    with FakeHub(repo) as running:
        yield running
