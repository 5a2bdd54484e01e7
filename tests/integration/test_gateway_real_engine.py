"""The gateway in front of the real transformers engine (SmolLM2-135M on CPU), driven by the
official openai and anthropic SDKs, streaming and not.

The engine runs as `sparkfold engine --config FILE` in a child process on a free port (one load
for the module, from the HF directory the `smol_dir` fixture keeps); the gateway runs in this
process on another free port.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from engine_procs import free_port, serving, write_config
from tests.fakes.harness import settings_for
from tests.fakes.scripted_engine import ServerThread

from sparkfold.api import create_app

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def engine_url(smol_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("engine")
    port = free_port()
    config = write_config(directory / "sparkfold.toml", smol_dir, port=port, max_tokens=24, parallel=2)
    with serving(config, directory / "engine.log", port) as url:
        yield url


@pytest.fixture(scope="module")
def gateway_url(engine_url: str) -> Iterator[str]:
    port = int(engine_url.rsplit(":", 1)[1])
    with ServerThread(create_app(settings_for(port, parallel=2, max_queued=4, keepalive_s=5))) as server:
        yield server.url


@pytest.fixture
def oai(gateway_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def claude(gateway_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway_url, api_key="unused", max_retries=0, timeout=120)


def test_models_and_health(oai: openai.OpenAI, gateway_url: str) -> None:
    assert next(model.id for model in oai.models.list()) == "smol"
    health = httpx.get(gateway_url + "/health").json()
    assert health["ok"] and health["engine"]["ok"] and health["lanes"]["total"] == 2


def test_chat(oai: openai.OpenAI) -> None:
    reply = oai.chat.completions.create(model="smol", messages=HELLO, max_tokens=12, temperature=0)  # type: ignore[arg-type]
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None and reply.usage.completion_tokens > 0


def streamed_hello(oai: openai.OpenAI) -> tuple[str, str | None]:
    """HELLO greedily as a stream: the text and the finish reason."""
    text, finish = "", None
    stream = oai.chat.completions.create(
        model="smol",
        messages=HELLO,
        max_tokens=12,
        temperature=0,
        stream=True,  # type: ignore[arg-type]
    )
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


def test_chat_stream(oai: openai.OpenAI) -> None:
    text, finish = streamed_hello(oai)
    assert text and finish in ("stop", "length")


def test_greedy_stream_equals_greedy_reply(oai: openai.OpenAI) -> None:
    whole = oai.chat.completions.create(model="smol", messages=HELLO, max_tokens=12, temperature=0)  # type: ignore[arg-type]
    assert streamed_hello(oai)[0] == whole.choices[0].message.content


def test_completions(oai: openai.OpenAI) -> None:
    reply = oai.completions.create(
        model="smol", prompt="The capital of France is", max_tokens=6, temperature=0
    )
    assert reply.choices[0].text


def test_messages(claude: anthropic.Anthropic) -> None:
    reply = claude.messages.create(model="smol", max_tokens=12, messages=HELLO)  # type: ignore[arg-type]
    assert reply.content and reply.content[-1].type == "text" and reply.content[-1].text
    assert reply.stop_reason in ("end_turn", "max_tokens")
    assert reply.usage.output_tokens > 0


def test_messages_stream(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(model="smol", max_tokens=12, messages=HELLO) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.stop_reason in ("end_turn", "max_tokens")


def test_count_tokens(claude: anthropic.Anthropic) -> None:
    assert claude.messages.count_tokens(model="smol", messages=HELLO).input_tokens > 3  # type: ignore[arg-type]


def test_responses(oai: openai.OpenAI) -> None:
    reply = oai.responses.create(model="smol", input="Say hello.", max_output_tokens=12)
    assert reply.output_text and reply.status in ("completed", "incomplete")
    with oai.responses.stream(model="smol", input="Say hello.", max_output_tokens=12) as stream:
        final = stream.get_final_response()
    assert final.output_text


def test_client_leaving_mid_stream_frees_the_lane(gateway_url: str) -> None:
    body = {"model": "smol", "messages": HELLO, "max_tokens": 24, "stream": True}
    with (
        httpx.Client(timeout=120) as http,
        http.stream("POST", gateway_url + "/v1/chat/completions", json=body) as r,
    ):
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data:") and '"content"' in line:
                break
        assert httpx.get(gateway_url + "/health").json()["lanes"]["busy"] == 1
    deadline = time.monotonic() + 10
    while httpx.get(gateway_url + "/health").json()["lanes"]["busy"] != 0:
        assert time.monotonic() < deadline, "the lane was not freed"
        time.sleep(0.05)
