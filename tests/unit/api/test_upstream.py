"""The engine client: keep-alive reuse, closing streams, and engines that close idle connections."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from tests.fakes.scripted_engine import Script, ScriptedEngine, ServerThread

from sparkfold.api.errors import ClientError, UpstreamUnavailable
from sparkfold.api.upstream import Engine

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "x"}], "stream": True}


def counting(port: int) -> tuple[Callable[..., Any], list[int]]:
    """A ``connect`` seam that dials the engine and counts the connections it opens."""
    opened: list[int] = []

    async def connect(factory: Callable[[], asyncio.Protocol]) -> Any:
        opened.append(1)
        return await asyncio.get_running_loop().create_connection(factory, "127.0.0.1", port)

    return connect, opened


async def read_all(engine: Engine) -> bytes:
    stream = await engine.open_stream("/v1/chat/completions", CHAT)
    try:
        return b"".join([chunk async for chunk in stream.chunks()])
    finally:
        await stream.aclose()


def test_a_finished_stream_gives_its_connection_back() -> None:
    fake = ScriptedEngine()
    with ServerThread(fake) as server:
        connect, opened = counting(server.port)

        async def main() -> list[bytes]:
            engine = Engine(server.url, timeout_s=5, connect=connect)
            try:
                bodies = [await read_all(engine) for _ in range(3)]
                assert (await engine.get_json("/health"))["ok"] is True
                return bodies
            finally:
                await engine.aclose()

        bodies = asyncio.run(main())
    assert all(body.endswith(b"data: [DONE]\n\n") for body in bodies)
    assert len(opened) == 1


def test_closing_a_stream_early_closes_its_connection() -> None:
    fake = ScriptedEngine(Script(content=["a", "b"], stall_after=1))
    with ServerThread(fake) as server:
        connect, opened = counting(server.port)

        async def main() -> None:
            engine = Engine(server.url, timeout_s=5, connect=connect)
            stream = await engine.open_stream("/v1/chat/completions", CHAT)
            assert await stream.read(5) is not None
            await stream.aclose()
            fake.default = Script()
            await read_all(engine)  # a new connection: the stalled one was closed, not pooled
            await engine.aclose()

        asyncio.run(main())
        fake.wait_for(lambda: fake.cancelled == 1)
    assert len(opened) == 2


def test_refusals_keep_the_engines_status_and_message() -> None:
    fake = ScriptedEngine()
    fake.queue(Script(status=422))
    with ServerThread(fake) as server:

        async def main() -> None:
            engine = Engine(server.url, timeout_s=5)
            with pytest.raises(ClientError) as refused:
                await engine.open_stream("/v1/chat/completions", CHAT)
            assert refused.value.status == 422
            assert "scripted refusal" in refused.value.message
            await read_all(engine)  # the refused exchange left a usable connection behind
            await engine.aclose()

        asyncio.run(main())


def test_an_engine_that_closes_each_connection_after_answering_is_retried_transparently() -> None:
    answer = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'

    async def main() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)  # keep-alive by HTTP/1.1 rules, then closed anyway
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        engine = Engine(f"http://127.0.0.1:{port}", timeout_s=5)
        try:
            for _ in range(5):
                assert await engine.get_json("/health") == {"ok": True}
        finally:
            await engine.aclose()
            server.close()
            await server.wait_closed()

    asyncio.run(main())


def test_an_engine_that_is_not_there_is_unavailable() -> None:
    async def main() -> None:
        with ServerThread(ScriptedEngine()) as server:
            url = server.url
        engine = Engine(url, timeout_s=5)  # the port is closed now
        with pytest.raises(UpstreamUnavailable, match="cannot reach the engine"):
            await engine.get_json("/health")

    asyncio.run(main())
