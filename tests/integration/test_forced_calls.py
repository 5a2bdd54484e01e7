"""Forced tool calls with parallel calls allowed end, on the real tiny GLM-5.3 model (random weights,
greedy) through the engine server and the gateway, asked by the openai and anthropic SDKs and
langchain-openai.

Under xgrammar's "one or more calls, any text around them" grammar the tiny model made one call and
then wrote text until ``max_tokens``; GLM-5.3 repeats calls the same way. Now a forced reply is its
calls alone, an identical call ends it and ``[engine] forced_calls_per_tool`` bounds how many.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from tests.fakes.harness import settings_for
from tests.fakes.scripted_engine import ServerThread

from sparkfold.api import create_app as create_gateway
from sparkfold.config import EngineSettings
from sparkfold.engines.server import create_app as create_engine
from sparkfold.engines.service import EngineService
from sparkfold.testing import torch_threads

pytestmark = pytest.mark.slow

BUDGET = 120
PICK = {
    "name": "pick",
    "parameters": {
        "type": "object",
        "properties": {"color": {"type": "string", "enum": ["red", "green"]}},
        "required": ["color"],
    },
}
ASK: Any = [{"role": "user", "content": "Pick a color"}]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from sparkfold.engines.transformers.backend import load
    from sparkfold.testing.tiny_glm import write_tiny_glm

    model = write_tiny_glm(tmp_path_factory.mktemp("tiny-glm"))
    settings = EngineSettings(model=str(model), thinking=False, context=2048, max_tokens=BUDGET, parallel=1)
    with torch_threads(1):
        generator = load(settings).generator
        assert generator is not None
        service = EngineService(generator, served_name="glm", max_tokens=BUDGET, thinking=False)
        with ServerThread(create_engine(service)) as engine:
            port = int(engine.url.rsplit(":", 1)[1])
            with ServerThread(create_gateway(settings_for(port))) as gateway:
                yield gateway.url
        generator.close()


def test_openai_required_parallel_calls_end(url: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    reply = client.chat.completions.create(
        model="glm",
        messages=ASK,
        tools=[{"type": "function", "function": PICK}],  # type: ignore[list-item]
        tool_choice="required",
        temperature=0,
        max_tokens=BUDGET,
    )
    choice = reply.choices[0]
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]  # type: ignore[union-attr]
    assert choice.finish_reason == "tool_calls" and reply.usage and reply.usage.completion_tokens < BUDGET
    assert calls and len(calls) == len({json.dumps(c) for c in calls}) and not choice.message.content


def test_anthropic_any_tool_ends(url: str) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=300)
    message = client.messages.create(
        model="glm",
        max_tokens=BUDGET,
        messages=ASK,
        tools=[{"name": PICK["name"], "input_schema": PICK["parameters"]}],  # type: ignore[list-item, typeddict-item]
        tool_choice={"type": "any"},
        extra_body={"temperature": 0},  # the SDK has no temperature argument any more
    )
    uses = [(b.name, json.dumps(b.input)) for b in message.content if b.type == "tool_use"]
    assert message.stop_reason == "tool_use" and uses and len(uses) == len(set(uses))


def test_langchain_required_tool_calls_end(url: str) -> None:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(model="glm", base_url=f"{url}/v1", api_key="unused", max_retries=0, temperature=0)  # type: ignore[arg-type]
    reply = chat.bind_tools([PICK], tool_choice="required").invoke("Pick a color", max_tokens=BUDGET)
    calls = [json.dumps([t["name"], t["args"]]) for t in reply.tool_calls]  # type: ignore[attr-defined]
    assert (
        reply.response_metadata["finish_reason"] == "tool_calls" and calls and len(calls) == len(set(calls))
    )
