"""GLM replies through the whole serving path, as a client sees them: the official openai SDK →
the gateway (``sparkfold api``'s app) → the engine server (``sparkfold.glm`` rendering and parsing
with the tiny GLM tokenizer) → a scripted GLM reply.

Tool calls must stream as the SDK expects (index, id and name first, then typed arguments in
pieces; ``finish_reason`` ``tool_calls``) and reasoning must arrive as ``reasoning_content`` apart from
``content`` (with ``reasoning`` as its alias).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from tests.fakes.harness import settings_for
from tests.fakes.scripted_engine import ServerThread
from tests.fakes.scripted_glm import ASK, CALL, TOOLS, ScriptedGlm

from sparkfold.api import create_app as create_gateway
from sparkfold.engines.server import create_app as create_engine
from sparkfold.engines.service import EngineService


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sparkfold.testing.tiny_glm import write_tiny_glm

    return write_tiny_glm(tmp_path_factory.mktemp("tiny-glm"))


@pytest.fixture(scope="module")
def client(tiny: Path) -> Iterator[openai.OpenAI]:
    service = EngineService(ScriptedGlm(tiny, CALL), served_name="fake", max_tokens=256)
    with ServerThread(create_engine(service)) as engine:
        port = int(engine.url.rsplit(":", 1)[1])
        with ServerThread(create_gateway(settings_for(port))) as gateway:
            yield openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_a_streamed_tool_call_streams_with_reasoning_apart(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model="fake", messages=ASK, tools=TOOLS, stream=True)  # type: ignore[arg-type]
    chunks = [c for c in stream if c.choices]
    extras = [c.choices[0].delta.model_extra or {} for c in chunks]
    assert "".join(e.get("reasoning_content") or "" for e in extras) == "Let me check the weather."
    assert "".join(e.get("reasoning") or "" for e in extras) == "Let me check the weather."
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Sure."
    calls = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
    assert calls[0].index == 0 and calls[0].id
    assert calls[0].function is not None and calls[0].function.name == "get_weather"
    arguments = "".join((c.function and c.function.arguments) or "" for c in calls)
    assert {c.index for c in calls} == {0} and json.loads(arguments) == {"city": "Paris", "days": 2}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_the_same_call_in_one_response(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="fake", messages=ASK, tools=TOOLS)  # type: ignore[arg-type]
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert (choice.message.model_extra or {}).get("reasoning_content") == "Let me check the weather."
    assert choice.message.content == "Sure."
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 2}  # type: ignore[union-attr]


def test_a_call_to_a_tool_not_offered_is_not_a_call(client: openai.OpenAI) -> None:
    other = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    reply = client.chat.completions.create(model="fake", messages=ASK, tools=other)  # type: ignore[arg-type]
    assert not reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason != "tool_calls"
