"""The client keeps the engine's stats block (drafted, accepted) of a streamed reply."""

from __future__ import annotations

import asyncio
import json

import httpx

from sparkfold.bench.client import Reply, stream_chat


def _sse(*chunks: object) -> bytes:
    return b"".join(f"data: {json.dumps(chunk)}\n\n".encode() for chunk in chunks) + b"data: [DONE]\n\n"


def _reply(body: bytes) -> Reply:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))

    async def send() -> Reply:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:1") as client:
            return await stream_chat(client, {"model": "m", "messages": []})

    return asyncio.run(send())


def test_the_stats_block_s_drafts_are_kept() -> None:
    body = _sse(
        {"choices": [{"index": 0, "delta": {"content": "OK"}}]},
        {
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "tensorfold": {"drafted": 8, "accepted": 6},
        },
    )
    reply = _reply(body)
    assert (reply.ok, reply.text, reply.drafted, reply.accepted) == (True, "OK", 8, 6)


def test_without_a_stats_block_the_drafts_are_unknown() -> None:
    reply = _reply(_sse({"choices": [{"index": 0, "delta": {"content": "OK"}, "finish_reason": "stop"}]}))
    assert (reply.drafted, reply.accepted) == (None, None)
