"""Helpers to run a gateway under test in front of an engine, on free loopback ports."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from sparkfold.api.app import App
from sparkfold.config import Settings, parse

__all__ = ["Running", "settings_for", "until"]


def until(predicate: Callable[[], Any], timeout: float = 10.0) -> None:
    """Wait for ``predicate()`` to hold, polling; AssertionError after ``timeout`` (a bound, not a timing)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


class Running:
    """A gateway under test: its URL, its app, and an httpx client to it."""

    def __init__(self, url: str, app: App) -> None:
        self.url = url
        self.app = app
        self.http = httpx.Client(base_url=url, timeout=30)

    def health(self) -> dict[str, Any]:
        return self.http.get("/health").json()


def settings_for(engine_port: int, *, served_name: str = "fake", **api: Any) -> Settings:
    base = {"host": "127.0.0.1", "port": 1, "keepalive_s": 15, "parallel": 4, "max_queued": 16}
    return parse(
        {
            "engine": {
                "model": "fake",
                "served_name": served_name,
                "port": engine_port,
                "context": 8192,
                "max_tokens": 256,
            },
            "api": {**base, **api},
        }
    )
