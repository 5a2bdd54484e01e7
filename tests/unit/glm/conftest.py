"""Fixtures for the GLM layer: the tiny GLM-5.3-Flash (written once per session) and its tokenizer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkfold.testing import torch_threads


@pytest.fixture(scope="session")
def tiny_glm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sparkfold.testing.tiny_glm import write_tiny_glm

    return write_tiny_glm(tmp_path_factory.mktemp("tiny-glm"))


@pytest.fixture(scope="session")
def tokenizer(tiny_glm: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_glm))


@pytest.fixture
def one_thread() -> Iterator[None]:
    with torch_threads(1):
        yield
