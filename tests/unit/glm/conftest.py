"""Fixtures for the GLM layer: the tiny GLM-5.3-Flash (written once per session) and its tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_glm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sparkfold.testing.tiny_glm import write_tiny_glm

    return write_tiny_glm(tmp_path_factory.mktemp("tiny-glm"))


@pytest.fixture(scope="session")
def tokenizer(tiny_glm: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_glm))
