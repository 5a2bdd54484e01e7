"""One ``sparkfold bench`` run: resolve the endpoint, run the chosen suites in order, keep it all.

The result is one JSON-ready dict (``FORMAT`` names its shape) holding the endpoint, the knobs,
each suite's numbers and error count, and the time each suite took; ``report`` turns it into the
recipe's tables and ``plots`` into pictures, so a saved run can be drawn again or compared later.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from sparkfold.bench.client import open_client, resolve_endpoint
from sparkfold.bench.suites import Knobs, run_suite

__all__ = ["FORMAT", "run", "total_errors"]

FORMAT = "sparkfold-bench/1"


OnSuite = Callable[[dict[str, Any]], None]


async def _run(
    url: str, suites: list[str], knobs: Knobs, api_key: str | None, model: str | None, on_suite: OnSuite
) -> dict[str, Any]:
    streams = max(*knobs.levels, knobs.exact_requests)
    async with open_client(url, api_key, knobs.max_seconds, streams) as client:
        endpoint = await resolve_endpoint(client, url, model, api_key)
        result: dict[str, Any] = {
            "format": FORMAT,
            "url": url,
            "model": endpoint.model,
            "window": endpoint.window,
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "knobs": asdict(knobs),
            "suites": {},
        }
        for name in suites:
            started = time.perf_counter()
            suite = await run_suite(name, client, endpoint, knobs)
            result["suites"][name] = suite | {"seconds": round(time.perf_counter() - started, 2)}
            on_suite(result)
    return result


def run(
    url: str,
    suites: list[str],
    knobs: Knobs,
    *,
    api_key: str | None = None,
    model: str | None = None,
    on_suite: OnSuite = lambda result: None,
) -> dict[str, Any]:
    """Run ``suites`` against ``url`` (the gateway, an engine server or a router); ``on_suite``
    gets the result so far after each suite (so a run cut short keeps what it measured)."""
    return asyncio.run(_run(url, suites, knobs, api_key, model, on_suite))


def total_errors(result: dict[str, Any]) -> int:
    return sum(int(suite.get("errors", 0)) for suite in result.get("suites", {}).values())
