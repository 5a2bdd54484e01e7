"""Rank 1's follow loop (node/supervisor.py ``_follow``): whatever ends the following ends the rank."""

from __future__ import annotations

import logging

import pytest

from sparkfold.config import Settings
from sparkfold.engines.generator import EngineFailure
from sparkfold.node import supervisor


class _Runner:
    """A rank-1 runner whose ``follow`` ends as rank 0's death ends it."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error

    def follow(self) -> None:
        if self.error is not None:
            raise self.error


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setattr(supervisor, "mark_serving", lambda settings: None)
    return Settings.model_validate(
        {
            "node": {"rank": 1},
            "engine": {"model": "unused", "tp": 2},
            "fabric": {"address": "203.0.113.2", "peer": "203.0.113.1"},
        }
    )


@pytest.mark.timeout(30)
def test_a_transport_error_in_a_collective_ends_the_rank_with_a_failure(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """The gloo error a worker meets when the head's rank is killed mid-collective; before, the
    follow thread died with it and the rank stayed up, fed its watchdog and was never restarted."""
    caplog.set_level(logging.ERROR, logger=supervisor.log.name)
    error = RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection reset by peer")
    assert supervisor._follow(settings, _Runner(error), None) == 1
    assert "following rank 0 failed" in caplog.text


@pytest.mark.timeout(30)
def test_an_engine_failure_ends_the_rank_with_a_failure(settings: Settings) -> None:
    assert supervisor._follow(settings, _Runner(EngineFailure("rank 0 went away")), None) == 1


@pytest.mark.timeout(30)
def test_rank_0_stopping_ends_the_rank_cleanly(settings: Settings) -> None:
    assert supervisor._follow(settings, _Runner(None), None) == 0
