"""Fixtures for the engine tests."""

from __future__ import annotations

import pytest
from tests.fakes.fake_engine import FakeGenerator


@pytest.fixture
def fake() -> FakeGenerator:
    return FakeGenerator()
