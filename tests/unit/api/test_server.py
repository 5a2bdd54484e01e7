"""How `sparkfold api` runs uvicorn: on uvloop and httptools when they are installed."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import uvicorn
import uvloop
from tests.fakes.harness import settings_for
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sparkfold.api import server


def test_serve_runs_on_uvicorns_loop_and_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    async def fake_serve(self: uvicorn.Server, sockets: Any = None) -> None:
        seen["loop"] = asyncio.get_running_loop()
        seen["config"] = self.config

    monkeypatch.setattr(uvicorn.Server, "serve", fake_serve)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        server.serve(settings_for(1))
    finally:
        root.handlers[:], root.level = handlers, level
        logging.getLogger("httpx").setLevel(logging.NOTSET)
    assert isinstance(seen["loop"], uvloop.Loop)
    seen["config"].load()
    protocol = seen["config"].http_protocol_class
    assert issubclass(protocol, HttpToolsProtocol) and protocol.limits.max_headers == 100  # bounded
