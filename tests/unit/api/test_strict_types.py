"""Strict types and bounded lists on every public field, as OpenAI's and Anthropic's APIs have them.

Each case was accepted before (read leniently, or passed on to the engine): ``true`` as 1,
``"yes"`` as true, an empty model name, a seed past 64 bits (which ended the CPU engine's
process), unknown ``tool_choice`` and ``text.format`` types, and lists of any length.
"""

from __future__ import annotations

import pytest
from tests.fakes.harness import Running
from tests.fakes.scripted_engine import ScriptedEngine

from sparkfold.protocol import MAX_CHOICES, MAX_CONTENT_PARTS, MAX_MESSAGES, MAX_STOP, MAX_TOOLS

USER = {"role": "user", "content": "x"}
CHAT = {"model": "fake", "messages": [USER]}
COMPLETION = {"model": "fake", "prompt": "x"}
RESPONSES = {"model": "fake", "input": "x"}
MESSAGES = {"model": "fake", "max_tokens": 8, "messages": [USER]}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

CASES = [
    ("/v1/chat/completions", CHAT, {"seed": 2**64}, "seed"),
    ("/v1/chat/completions", CHAT, {"seed": -(2**63) - 1}, "seed"),
    ("/v1/completions", COMPLETION, {"seed": 18446744073709551616}, "seed"),
    ("/v1/chat/completions", CHAT, {"max_tokens": True}, "max_tokens"),
    ("/v1/chat/completions", CHAT, {"stream": "yes"}, "stream"),
    ("/v1/chat/completions", CHAT, {"temperature": "0.5"}, "temperature"),
    ("/v1/chat/completions", CHAT, {"model": ""}, "model"),
    ("/v1/chat/completions", CHAT, {"tool_choice": "sometimes"}, "tool_choice"),
    ("/v1/chat/completions", CHAT, {"tool_choice": {"type": "wizard"}}, "tool_choice"),
    ("/v1/chat/completions", CHAT, {"tools": [TOOL] * (MAX_TOOLS + 1)}, "tools"),
    ("/v1/chat/completions", CHAT, {"messages": [USER] * (MAX_MESSAGES + 1)}, "messages"),
    ("/v1/chat/completions", CHAT, {"stop": ["x"] * (MAX_STOP + 1)}, "stop"),
    ("/v1/chat/completions", CHAT, {"guided_choice": ["a"] * (MAX_CHOICES + 1)}, "guided_choice"),
    (
        "/v1/chat/completions",
        CHAT,
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "x"}] * (MAX_CONTENT_PARTS + 1)}
            ]
        },
        "messages.0.content",
    ),
    ("/v1/completions", COMPLETION, {"max_tokens": True}, "max_tokens"),
    ("/v1/completions", COMPLETION, {"echo": "no"}, "echo"),
    ("/v1/responses", RESPONSES, {"stream": "yes"}, "stream"),
    ("/v1/responses", RESPONSES, {"max_output_tokens": True}, "max_output_tokens"),
    ("/v1/responses", RESPONSES, {"model": ""}, "model"),
    ("/v1/responses", RESPONSES, {"tool_choice": "sometimes"}, "tool_choice"),
    ("/v1/responses", RESPONSES, {"text": {"format": {"type": "yaml"}}}, "text"),
    ("/v1/responses", RESPONSES, {"tools": [TOOL] * (MAX_TOOLS + 1)}, "tools"),
    ("/v1/messages", MESSAGES, {"max_tokens": True}, "max_tokens"),
    ("/v1/messages", MESSAGES, {"stream": "yes"}, "stream"),
    ("/v1/messages", MESSAGES, {"model": ""}, "model"),
    ("/v1/messages", MESSAGES, {"stop_sequences": ["x"] * (MAX_STOP + 1)}, "stop_sequences"),
    (
        "/tokenize",
        {"model": "fake", "messages": [USER]},
        {"add_generation_prompt": "yes"},
        "add_generation_prompt",
    ),
    ("/tokenize", {"model": "fake", "prompt": "x"}, {"messages": []}, "messages"),
]


@pytest.mark.parametrize(("path", "body", "fields", "param"), CASES, ids=[f"{c[0]}:{c[3]}" for c in CASES])
def test_a_wrongly_typed_or_oversized_field_is_a_400_naming_it(
    gateway: Running,
    fake: ScriptedEngine,
    path: str,
    body: dict[str, object],
    fields: dict[str, object],
    param: str,
) -> None:
    response = gateway.http.post(path, json={**body, **fields})
    assert response.status_code == 400, response.text
    text = response.text
    assert param.split(".")[0] in text
    assert fake.requests == [] or all(r.get("path") != path for r in fake.requests)


def test_a_seed_inside_64_bits_and_an_integral_float_still_pass(gateway: Running) -> None:
    response = gateway.http.post("/v1/chat/completions", json={**CHAT, "seed": 2**63 - 1, "temperature": 1})
    assert response.status_code == 200, response.text
