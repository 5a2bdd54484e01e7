"""Fixtures: a scripted engine and gateways in front of it, both on free loopback ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from sparkfold.api import create_app
from sparkfold.api.app import App
from sparkfold.config import Settings, parse
from tests.fakes.scripted_engine import ScriptedEngine, ServerThread


class Running:
    """A gateway under test: its URL, its app, and an httpx client to it."""

    def __init__(self, url: str, app: App) -> None:
        self.url = url
        self.app = app
        self.http = httpx.Client(base_url=url, timeout=30)

    def health(self) -> dict[str, Any]:
        return self.http.get("/health").json()


def settings_for(engine_port: int, **api: Any) -> Settings:
    base = {"host": "127.0.0.1", "port": 1, "keepalive_s": 15, "parallel": 4, "max_queued": 16}
    return parse(
        {
            "engine": {
                "model": "fake",
                "served_name": "fake",
                "port": engine_port,
                "context": 8192,
                "max_tokens": 256,
            },
            "api": {**base, **api},
        }
    )


@pytest.fixture
def engine() -> Iterator[tuple[ScriptedEngine, ServerThread]]:
    fake = ScriptedEngine()
    with ServerThread(fake) as server:
        yield fake, server


@pytest.fixture
def start_gateway(engine: tuple[ScriptedEngine, ServerThread]) -> Iterator[Callable[..., Running]]:
    _, engine_server = engine
    with ExitStack() as stack:

        def start(**api: Any) -> Running:
            app = create_app(settings_for(engine_server.port, **api))
            server = stack.enter_context(ServerThread(app))
            running = Running(server.url, app)
            stack.callback(running.http.close)
            return running

        yield start


@pytest.fixture
def fake(engine: tuple[ScriptedEngine, ServerThread]) -> ScriptedEngine:
    return engine[0]


@pytest.fixture
def gateway(start_gateway: Callable[..., Running]) -> Running:
    return start_gateway()
