"""Fixtures: a scripted engine and gateways in front of it, both on free loopback ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from tests.fakes.harness import Running, settings_for
from tests.fakes.scripted_engine import ScriptedEngine, ServerThread

from sparkfold.api import create_app
from sparkfold.api.capabilities import EngineStart


@pytest.fixture
def start_gateway(engine: tuple[ScriptedEngine, ServerThread]) -> Iterator[Callable[..., Running]]:
    _, engine_server = engine
    with ExitStack() as stack:

        def start(engine_start: EngineStart | None = None, **api: Any) -> Running:
            app = create_app(settings_for(engine_server.port, **api), engine_start=engine_start)
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
