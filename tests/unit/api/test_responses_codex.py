"""The Responses request shapes Codex CLI sends, through the gateway with the official openai SDK.

Codex (0.171.0) offers some of its tools inside a ``namespace`` tool, sends a hosted
``web_search`` tool, asks for ``reasoning.encrypted_content`` with ``store: false`` and sends the
reasoning items back on the next turn, with ``prompt_cache_key``, ``client_metadata``,
developer-role input and ``reasoning.summary``. The scripted engine stands in for the model.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import openai
import pytest
from tests.fakes.harness import Running
from tests.fakes.scripted_engine import Script, ScriptedEngine

from sparkfold.api.ignored_tools import IGNORED_TOOLS_HEADER
from sparkfold.api.sealed import ReasoningSeal

OBJECT = {"type": "object", "properties": {"message": {"type": "string"}}}
CODEX_TOOLS: list[Any] = [
    {"type": "function", "name": "shell", "parameters": OBJECT},
    {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "sub-agents",
        "tools": [
            {"type": "function", "name": "spawn_agent", "description": "start one", "parameters": OBJECT},
            {"type": "function", "name": "wait", "parameters": OBJECT},
        ],
    },
    {"type": "web_search", "external_web_access": False},
]


def client(gateway: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


def codex_request(**fields: Any) -> dict[str, Any]:
    return {
        "model": "fake",
        "instructions": "You are Codex.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]},
        ],
        "tools": CODEX_TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "high", "summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199-session",
        "extra_body": {"client_metadata": {"originator": "codex_exec"}},
        **fields,
    }


@pytest.mark.parametrize("stream", [False, True])
def test_codex_first_request_is_answered_with_its_namespace_call(
    gateway: Running, fake: ScriptedEngine, stream: bool
) -> None:
    fake.queue(
        Script(
            reasoning=["plan"], content=[], tool_calls=[("multi_agent_v1.spawn_agent", '{"message": "go"}')]
        )
    )
    raw = client(gateway).responses.with_raw_response.create(**codex_request(stream=stream))
    assert raw.headers[IGNORED_TOOLS_HEADER] == "web_search"
    reply = raw.parse()
    if stream:
        events = list(reply)  # type: ignore[call-overload]
        assert events[-1].type == "response.completed"
        reply = events[-1].response
    sent = fake.requests[-1]
    assert [tool["function"]["name"] for tool in sent["tools"]] == [
        "shell",
        "multi_agent_v1.spawn_agent",
        "multi_agent_v1.wait",
    ]
    assert [m["role"] for m in sent["messages"]] == ["system", "developer", "user"]  # GLM: a system turn
    reasoning, call = reply.output
    assert call.type == "function_call"
    assert (call.name, call.namespace, json.loads(call.arguments)) == (
        "spawn_agent",
        "multi_agent_v1",
        {"message": "go"},
    )
    assert reasoning.type == "reasoning" and reasoning.encrypted_content


def test_reasoning_sent_back_encrypted_is_restored_and_the_namespace_call_named_again(
    gateway: Running, fake: ScriptedEngine
) -> None:
    """A stateless second turn: the reply's items come back as input, the reasoning item with its
    ``encrypted_content`` only (no text), the call with its namespace."""
    fake.queue(Script(reasoning=["plan"], content=[], tool_calls=[("multi_agent_v1.wait", "{}")]))
    api = client(gateway).responses
    first = api.create(**codex_request())
    reasoning, call = (item.model_dump(exclude_none=True) for item in first.output)
    reasoning.pop("content")  # Codex keeps only the blob
    fake.queue(Script(content=["done"]))
    turn = codex_request()
    turn["input"] += [
        reasoning,
        call,
        {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"},
    ]
    api.create(**turn)
    sent = fake.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["system", "developer", "user", "assistant", "tool"]
    assert sent[3]["reasoning_content"] == "plan"
    assert sent[3]["tool_calls"][0]["function"]["name"] == "multi_agent_v1.wait"


def test_altered_encrypted_content_is_a_400_naming_the_item(gateway: Running, fake: ScriptedEngine) -> None:
    fake.queue(Script(reasoning=["plan"], content=["x"]))
    first = client(gateway).responses.create(**codex_request())
    blob = first.output[0].encrypted_content  # type: ignore[union-attr]
    assert blob is not None
    prefix, payload, tag = blob.split(".")
    fields = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    altered = json.dumps({**fields, "t": "other plan"}).encode()  # the same key id, other text
    forged = base64.urlsafe_b64encode(altered).decode().rstrip("=")
    for bad in (f"{prefix}.{forged}.{tag}", "not a blob", blob[:-4]):
        turn = codex_request()
        turn["input"].append({"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": bad})
        with pytest.raises(openai.BadRequestError, match=r"input\[2\]\.encrypted_content"):
            client(gateway).responses.create(**turn)


def test_reasoning_sealed_by_another_gateway_start_is_dropped(gateway: Running, fake: ScriptedEngine) -> None:
    """After a restart the key is new: the old blobs are well-formed, and their reasoning is left out."""
    turn = codex_request()
    earlier = ReasoningSeal().seal("from before")
    turn["input"] += [
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": earlier},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "again"}]},
    ]
    client(gateway).responses.create(**turn)
    assert "reasoning_content" not in fake.requests[-1]["messages"][3]


def test_reasoning_items_carry_no_blob_unless_asked(gateway: Running, fake: ScriptedEngine) -> None:
    fake.queue(Script(reasoning=["plan"], content=["x"]))
    reply = client(gateway).responses.create(model="fake", input="hi")
    assert reply.output[0].type == "reasoning" and reply.output[0].encrypted_content is None


def test_an_unknown_tool_type_is_a_400_naming_the_known_ones(gateway: Running) -> None:
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\]: unknown tool type 'functoin'.*web_search"):
        client(gateway).responses.create(model="fake", input="x", tools=[{"type": "functoin", "name": "f"}])  # type: ignore[list-item]


def test_the_ignored_tools_header_holds_any_tool_name(gateway: Running) -> None:
    """A name with a line break or non-ASCII text is escaped, never an invalid header (the
    connection closed without an answer)."""
    tools: Any = [{"type": "mcp", "server_label": "a\nb\x0bé"}, {"type": "web_search"}]
    raw = client(gateway).responses.with_raw_response.create(model="fake", input="x", tools=tools)
    assert raw.headers[IGNORED_TOOLS_HEADER] == "mcp:a\\nb\\x0b\\xe9, web_search"
