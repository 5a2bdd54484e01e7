"""No lane is ever lost (issue 12), driving the real gateway and the real CPU engine over loopback.

The engine (SmolLM2-135M, ``sparkfold engine`` in a child process, two lanes) and the gateway
(two lanes, in this process) are started once for the module. Every wait is bounded and waits
for a counter (``/health``), never for a length of time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from engine_procs import free_port, serving, write_config
from tests.fakes.harness import settings_for, until
from tests.fakes.raw_client import RawClient
from tests.fakes.scripted_engine import ServerThread

from sparkfold.api import create_app

pytestmark = pytest.mark.slow

LONG = {
    "model": "smol",
    "messages": [{"role": "user", "content": "Count to a thousand."}],
    "max_tokens": 400,
    "ignore_eos": True,
    "temperature": 0,
}


@pytest.fixture(scope="module")
def pair(smol_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    directory = tmp_path_factory.mktemp("lanes")
    port = free_port()
    config = write_config(directory / "sparkfold.toml", smol_dir, port=port, max_tokens=512, parallel=2)
    with serving(config, directory / "engine.log", port) as engine_url:
        app = create_app(settings_for(port, parallel=2, max_queued=4, keepalive_s=5))
        with ServerThread(app) as gateway:
            yield engine_url, gateway.url


def running(engine_url: str) -> int:
    return int(httpx.get(engine_url + "/health").json()["requests_running"])


def test_every_queued_request_succeeds_after_a_cancel(pair: tuple[str, str]) -> None:
    """Both lanes busy, one request queued, a streaming client leaves: 20 of 20 queued requests
    get their lane and a clean reply (before the fix the engine refused most of them)."""
    engine_url, gateway_url = pair
    port = int(gateway_url.rsplit(":", 1)[1])
    clean = 0
    for _ in range(20):
        busy = [RawClient(port, "/v1/chat/completions", {**LONG, "stream": True}) for _ in range(2)]
        for client in busy:
            assert client.status() == 200
        until(lambda: running(engine_url) == 2, timeout=60)
        queued = RawClient(port, "/v1/chat/completions", {**LONG, "stream": True, "max_tokens": 3})
        until(lambda: httpx.get(gateway_url + "/health").json()["queue"]["length"] == 1, timeout=60)
        busy[0].close()  # its lane goes to the queued request at once
        reply = queued.read_until(b"data: [DONE]", timeout=120)
        queued.close()
        busy[1].close()
        clean += queued.status() == 200 and b'"error"' not in reply and b'"finish_reason":"length"' in reply
        until(
            lambda: (
                running(engine_url) == 0 and httpx.get(gateway_url + "/health").json()["lanes"]["busy"] == 0
            ),
            timeout=60,
        )
    assert clean == 20


def test_an_abandoned_non_streamed_request_frees_its_lane_within_2_s(pair: tuple[str, str]) -> None:
    engine_url, gateway_url = pair
    port = int(gateway_url.rsplit(":", 1)[1])
    leaver = RawClient(port, "/v1/chat/completions", LONG)  # not streamed: nothing comes until the end
    until(lambda: running(engine_url) == 1, timeout=60)
    leaver.close()
    until(lambda: running(engine_url) == 0, timeout=2)
    until(lambda: httpx.get(gateway_url + "/health").json()["lanes"]["busy"] == 0, timeout=2)
