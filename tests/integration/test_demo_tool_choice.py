"""Forced tool calls on the demo model (SmolLM2-135M through its chat template, the CPU engine),
through the gateway with the openai SDK: the reply is the calls, in the template's
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` form, nothing else; streamed, each call
is named before its arguments are written.

The question asks for no tool ("Say hello"), so only the grammar can make the reply a call; a
135M model left to itself writes on after a call until ``max_tokens``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from engine_procs import free_port, serving, write_config
from tests.fakes.harness import settings_for
from tests.fakes.scripted_engine import ServerThread

from sparkfold.api import create_app

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "Say hello to me."}]
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 8}}},
    },
}
DICE = {
    "type": "function",
    "function": {
        "name": "roll",
        "parameters": {"type": "object", "properties": {"sides": {"type": "integer", "maximum": 20}}},
    },
}
BUDGET = 120


@pytest.fixture(scope="module")
def oai(smol_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    directory = tmp_path_factory.mktemp("demo-tools")
    port = free_port()
    config = write_config(
        directory / "sparkfold.toml", smol_dir, port=port, served_name="demo", max_tokens=BUDGET
    )
    with (
        serving(config, directory / "engine.log", port),
        ServerThread(create_app(settings_for(port, parallel=2, max_queued=4, keepalive_s=30))) as gateway,
    ):
        yield openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=300)


CHOICES: dict[str, dict[str, Any]] = {
    "required": {"tool_choice": "required"},
    "required, one call": {"tool_choice": "required", "parallel_tool_calls": False},
    "named": {"tool_choice": {"type": "function", "function": {"name": "roll"}}},
}


def _calls_alone(calls: list[Any], content: str | None, finish: str | None, forced: dict[str, Any]) -> None:
    assert calls, f"no call; content {content!r}, finish {finish}"
    assert not content, f"text besides the calls: {content!r}"
    assert finish == "tool_calls"
    for call in calls:
        assert call.function.name in {"get_time", "roll"}
        assert isinstance(json.loads(call.function.arguments), dict)
    if forced.get("parallel_tool_calls") is False or isinstance(forced["tool_choice"], dict):
        assert len(calls) == 1
    if isinstance(forced["tool_choice"], dict):
        assert calls[0].function.name == "roll"


@pytest.mark.parametrize("forced", CHOICES.values(), ids=CHOICES.keys())
def test_a_forced_call_is_the_whole_reply(oai: openai.OpenAI, forced: dict[str, Any]) -> None:
    reply = oai.chat.completions.create(
        model="demo",
        messages=HELLO,
        tools=[CLOCK, DICE],
        max_tokens=BUDGET,
        temperature=0,
        **forced,  # type: ignore[arg-type]
    )
    choice = reply.choices[0]
    _calls_alone(choice.message.tool_calls or [], choice.message.content, choice.finish_reason, forced)


def test_a_forced_call_is_the_whole_streamed_reply(oai: openai.OpenAI) -> None:
    forced = CHOICES["required"]
    with oai.chat.completions.stream(
        model="demo",
        messages=HELLO,
        tools=[CLOCK, DICE],
        max_tokens=BUDGET,
        temperature=0,
        **forced,  # type: ignore[arg-type]
    ) as stream:
        chunks = [event.chunk for event in stream if event.type == "chunk"]
        final = stream.get_final_completion()
    choice = final.choices[0]
    _calls_alone(choice.message.tool_calls or [], choice.message.content, choice.finish_reason, forced)
    pieces = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    for index in range(len(choice.message.tool_calls or [])):  # each call streamed: named, then its arguments
        first, *rest = [p for p in pieces if p.index == index]
        assert first.function is not None and first.function.name and rest, pieces
