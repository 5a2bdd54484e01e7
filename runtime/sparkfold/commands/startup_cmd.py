"""``sparkfold startup --config FILE [--smoke] [--json]``: how long this node's engine start took."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

import click

from sparkfold.commands._options import bounded_option, config_option, echo_json, json_option
from sparkfold.config import Settings


@click.command()
@config_option
@json_option
@click.option("--smoke", is_flag=True, help="Rank 0: send one streamed chat completion through the gateway.")
@click.option("--key-stdin", is_flag=True, help="Read the gateway's API key for --smoke from stdin.")
@click.option("--prompt", default="Reply with OK.", show_default=True, help="The smoke request's message.")
@bounded_option("--max-tokens", 16, 1, 4096, "The smoke request's reply budget (thinking off).")
@bounded_option("--timeout-s", 180, 1, 3600, "Seconds the smoke request may take.", metavar="SECONDS")
def command(
    settings: Settings,
    as_json: bool,
    smoke: bool,
    key_stdin: bool,
    prompt: str,
    max_tokens: int,
    timeout_s: int,
) -> None:
    """Seconds from the engine unit's start to its port open, to READY (/health ready) and (--smoke,
    rank 0) to the first streamed token of a smoke request; exits 1 when the smoke request fails."""
    from sparkfold.node.startup import startup

    key = sys.stdin.readline().strip() if key_stdin else None
    send = _smoke(settings, key, prompt, max_tokens, timeout_s) if smoke else None
    found = startup(settings, send)
    if as_json:
        echo_json(found.as_dict())
    else:
        click.echo(found.line())
    if found.smoke is not None and not found.smoke["ok"]:
        if not as_json:
            click.echo(f"smoke request failed: {found.smoke['error']}", err=True)
        raise SystemExit(1)


def _smoke(
    settings: Settings, key: str | None, prompt: str, max_tokens: int, timeout_s: int
) -> Callable[[Callable[[], object]], dict[str, Any]]:
    """One streamed chat completion through this node's gateway, thinking off (a short budget would
    end inside GLM's reasoning with no answer)."""
    from sparkfold.bench.client import open_client, stream_chat
    from sparkfold.node.startup import gateway_url

    body = {
        "model": settings.engine.served_name,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "reasoning_effort": "none",
    }

    async def send(on_first_token: Callable[[], object]) -> dict[str, Any]:
        async with open_client(gateway_url(settings), key, timeout_s, 1) as client:
            reply = await stream_chat(client, body, on_first_token)
        return {
            "ok": reply.ok,
            "error": reply.error,
            "text": reply.text,
            "tokens": reply.tokens,
            "ttft_s": None if reply.ttft_s is None else round(reply.ttft_s, 3),
            "finish_reason": reply.finish_reason,
            "drafted": reply.drafted,
            "accepted": reply.accepted,
        }

    return lambda on_first_token: asyncio.run(send(on_first_token))
