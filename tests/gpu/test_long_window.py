"""Long prompts through the gateway in front of the exllamav3 engine (``SPARKFOLD_EXL3_MODEL``).

The engine runs with a 327,680-token window and its defaults otherwise (recurrent checkpoints
every 32,768 prompt tokens); the gateway (``sparkfold api``'s app, default limits and timeouts)
stands in front of it. What is asserted is what reaches the client (status, token counts, the
reused tokens), never a time; the times go to ``gpu_results.json``. ``tests/bench/long_window.py``
measures the full window.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gpu_engine import Results, start_engine, text_of
from tests.fakes.harness import settings_for
from tests.fakes.scripted_engine import ServerThread

from sparkfold.api import create_app

WINDOW = 327_680
CHECKPOINT = 32_768
"""The engine's default ``prefill_checkpoint_interval``: a KDA prefix resumes at one of these."""


@pytest.fixture(scope="module")
def tokenizer(exl3_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(exl3_model))


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, exl3_model: Path) -> Iterator[httpx.Client]:
    url, proc = start_engine(tmp_path_factory.mktemp("long"), exl3_model, "long", context=WINDOW, parallel=2)
    try:
        port = int(url.rsplit(":", 1)[1])
        with (
            ServerThread(create_app(settings_for(port))) as server,
            httpx.Client(base_url=server.url, timeout=300) as http,
        ):
            yield http
    finally:
        proc.stop()


def ask(gateway: httpx.Client, text: str) -> dict[str, Any]:
    body = {
        "model": "glm",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 4,
        "temperature": 0,
    }
    response = gateway.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text[:500]
    return dict(response.json())


def test_a_prompt_past_256k_tokens_is_answered_through_the_gateway(
    gateway: httpx.Client, tokenizer: Any, results: Results
) -> None:
    reply = ask(gateway, text_of(tokenizer, 300_000, 7))
    usage = reply["usage"]
    results.record("long_prompt_tokens", usage["prompt_tokens"])
    assert usage["prompt_tokens"] > 262_144
    assert usage["completion_tokens"] >= 1
    assert reply["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_resent_64k_prompt_is_reused_through_the_gateway(
    gateway: httpx.Client, tokenizer: Any, results: Results
) -> None:
    text = text_of(tokenizer, 66_000, 8)
    first, again = ask(gateway, text), ask(gateway, text)
    prompt = first["usage"]["prompt_tokens"]
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    results.record("resent_64k_prompt_tokens", prompt)
    results.record("resent_64k_cached_tokens", cached)
    assert prompt >= 65_536
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert cached >= prompt - CHECKPOINT, (cached, prompt)  # resumed at a checkpoint, not read again
