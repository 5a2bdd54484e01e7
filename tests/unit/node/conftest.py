"""Fixtures of the node check tests."""

from __future__ import annotations

import pytest
from node_fakes import FakeHost


@pytest.fixture
def host() -> FakeHost:
    return FakeHost()
