"""Fixtures of the fixture tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sparkfold.testing import torch_threads


@pytest.fixture
def one_thread() -> Iterator[None]:
    with torch_threads(1):
        yield
