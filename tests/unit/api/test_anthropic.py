"""Anthropic Messages through the gateway with the official anthropic SDK (scripted engine)."""

from __future__ import annotations

import logging

import anthropic
import pytest
from anthropic.types import ModelInfo
from pydantic import BaseModel
from tests.fakes.harness import Running
from tests.fakes.scripted_engine import Script, ScriptedEngine

TOOL = {
    "name": "weather",
    "description": "forecast",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    },
}


def client(gateway: Running) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0)


def test_text_and_thinking_reply(gateway: Running, fake: ScriptedEngine) -> None:
    fake.queue(Script(reasoning=["hmm"], content=["Hel", "lo"]))
    reply = client(gateway).messages.create(
        model="fake",
        max_tokens=50,
        system="be brief",
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[{"role": "user", "content": "hi"}],
    )
    assert [block.type for block in reply.content] == ["thinking", "text"]
    assert reply.content[0].thinking == "hmm"  # type: ignore[union-attr]
    assert reply.content[1].text == "Hello"  # type: ignore[union-attr]
    assert reply.stop_reason == "end_turn"
    assert reply.usage.output_tokens == 3
    sent = fake.requests[-1]
    assert sent["messages"][0] == {"role": "system", "content": "be brief"}
    assert sent["chat_template_kwargs"] == {"enable_thinking": True}
    assert sent["thinking_budget"] == 1024


def test_tool_use_round_trip(gateway: Running, fake: ScriptedEngine) -> None:
    fake.queue(Script(content=[], tool_calls=[("weather", '{"city": "Oslo", "days": "2"}')]))
    reply = client(gateway).messages.create(
        model="fake",
        max_tokens=50,
        tools=[TOOL],
        messages=[{"role": "user", "content": "weather?"}],  # type: ignore[list-item]
    )
    assert reply.stop_reason == "tool_use"
    use = reply.content[0]
    assert use.type == "tool_use" and use.name == "weather" and use.input == {"city": "Oslo", "days": 2}
    fake.queue(Script(content=["Sunny"]))
    client(gateway).messages.create(
        model="fake",
        max_tokens=50,
        tools=[TOOL],  # type: ignore[list-item]
        messages=[
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [use.model_dump()]},  # type: ignore[list-item]
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]},
        ],
    )
    sent = fake.requests[-1]["messages"]
    assert sent[1]["tool_calls"][0]["function"]["name"] == "weather"
    assert sent[2] == {"role": "tool", "tool_call_id": use.id, "content": "sunny"}


def test_streamed_text_thinking_and_tool_use(gateway: Running, fake: ScriptedEngine) -> None:
    fake.queue(
        Script(reasoning=["r1", "r2"], content=["a", "b"], tool_calls=[("weather", '{"city": "Rome"}')])
    )
    with client(gateway).messages.stream(
        model="fake",
        max_tokens=50,
        tools=[TOOL],
        messages=[{"role": "user", "content": "x"}],  # type: ignore[list-item]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "message_delta" in kinds
    assert [block.type for block in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[0].thinking == "r1r2"  # type: ignore[union-attr]
    assert final.content[1].text == "ab"  # type: ignore[union-attr]
    assert final.content[2].input == {"city": "Rome"}  # type: ignore[union-attr]
    assert final.stop_reason == "tool_use"
    assert final.usage.output_tokens == 4


def test_stop_sequence_is_reported(gateway: Running, fake: ScriptedEngine) -> None:
    fake.queue(Script(content=["a"], stop_reason="END"))
    reply = client(gateway).messages.create(
        model="fake", max_tokens=5, stop_sequences=["END"], messages=[{"role": "user", "content": "x"}]
    )
    assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", "END")


def test_error_mid_stream_is_an_error_event(gateway: Running, fake: ScriptedEngine) -> None:
    fake.queue(Script(content=["a", "b"], error_after=1))
    with pytest.raises(anthropic.APIStatusError, match="scripted failure"):  # noqa: SIM117
        with client(gateway).messages.stream(
            model="fake", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        ) as stream:
            for _ in stream:
                pass


def test_count_tokens(gateway: Running) -> None:
    count = client(gateway).messages.count_tokens(
        model="fake", messages=[{"role": "user", "content": "one two"}]
    )
    assert count.input_tokens > 0


def test_usage_always_has_both_cache_fields(gateway: Running, fake: ScriptedEngine) -> None:
    """Anthropic's usage carries ``cache_creation_input_tokens`` and ``cache_read_input_tokens``;
    clients add them up, so both are integers everywhere usage is: reply, message_start, message_delta."""
    ask = client(gateway).messages
    reply = ask.create(model="fake", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert (reply.usage.cache_creation_input_tokens, reply.usage.cache_read_input_tokens) == (0, 0)
    with ask.stream(model="fake", max_tokens=5, messages=[{"role": "user", "content": "x"}]) as stream:
        events = list(stream)
    usages = [e.message.usage for e in events if e.type == "message_start"]
    usages += [e.usage for e in events if e.type == "message_delta"]
    assert len(usages) == 2
    for usage in usages:
        assert (usage.cache_creation_input_tokens, usage.cache_read_input_tokens) == (0, 0)


@pytest.mark.parametrize("stream", [False, True])
def test_input_tokens_are_the_prompt_less_what_the_cache_gave(
    gateway: Running, fake: ScriptedEngine, stream: bool
) -> None:
    """Anthropic's prompt is input_tokens + cache_creation_input_tokens + cache_read_input_tokens:
    an engine's cached prefix is counted once, as read from the cache."""
    fake.queue(Script(content=["a"], prompt_tokens=40, cached_tokens=32))
    ask = client(gateway).messages
    if stream:
        with ask.stream(model="fake", max_tokens=5, messages=[{"role": "user", "content": "x"}]) as events:
            usage = events.get_final_message().usage
    else:
        usage = ask.create(model="fake", max_tokens=5, messages=[{"role": "user", "content": "x"}]).usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (
        8,
        32,
        0,
    )


REDACTED_HISTORY = [
    {"role": "user", "content": "x"},
    {
        "role": "assistant",
        "content": [
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT"},
            {"type": "text", "text": "done"},
        ],
    },
    {"role": "user", "content": "again"},
]


@pytest.mark.parametrize("stream", [False, True])
def test_redacted_thinking_in_the_history_is_dropped_and_logged(
    gateway: Running, fake: ScriptedEngine, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    """Claude Code sends its history back with ``redacted_thinking`` blocks, which only Anthropic's
    servers can read: the turn is taken without them, and the log says where they were."""
    ask = client(gateway).messages
    with caplog.at_level(logging.INFO, logger="sparkfold.api.anthropic.serving"):
        if stream:
            with ask.stream(model="fake", max_tokens=5, messages=REDACTED_HISTORY) as events:  # type: ignore[arg-type]
                reply = events.get_final_message()
        else:
            reply = ask.create(model="fake", max_tokens=5, messages=REDACTED_HISTORY)  # type: ignore[arg-type]
        counted = ask.count_tokens(model="fake", messages=REDACTED_HISTORY)  # type: ignore[arg-type]
    assert reply.content[0].text == "Hello, world!"  # type: ignore[union-attr]
    assert counted.input_tokens > 0
    sent = fake.requests[-1]["messages"]
    assert sent[1] == {"role": "assistant", "content": "done"}
    logged = [r for r in caplog.records if r.getMessage() == "dropped redacted_thinking blocks"]
    assert len(logged) == 2  # the reply and the count
    assert logged[0].fields == ["messages[1].content[0]"]  # type: ignore[attr-defined]
    assert logged[0].request_id  # type: ignore[attr-defined]


def test_refused_fields_and_blocks(gateway: Running) -> None:
    with pytest.raises(anthropic.BadRequestError, match="mcp_servers"):
        client(gateway).messages.create(
            model="fake",
            max_tokens=5,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"mcp_servers": [{"url": "x"}]},
        )


@pytest.mark.parametrize("stream", [False, True])
def test_a_prefilled_reply_is_refused_not_answered_afresh(
    gateway: Running, fake: ScriptedEngine, stream: bool
) -> None:
    """Anthropic continues a final assistant turn (a prefill, e.g. "{" to start JSON); the engines
    answer a new turn instead, so the reply would not continue it: a 400 that says so."""
    messages = [{"role": "user", "content": "JSON please"}, {"role": "assistant", "content": "{"}]
    ask = client(gateway).messages
    with pytest.raises(anthropic.BadRequestError, match="prefill"):
        if stream:
            with ask.stream(model="fake", max_tokens=5, messages=messages) as events:  # type: ignore[arg-type]
                events.get_final_message()
        else:
            ask.create(model="fake", max_tokens=5, messages=messages)  # type: ignore[arg-type]
    assert fake.requests == []
    counted = ask.count_tokens(model="fake", messages=messages)  # type: ignore[arg-type]
    assert counted.input_tokens > 0  # a prompt with a final assistant turn still counts


class City(BaseModel):
    city: str


def test_structured_output_reaches_the_engine_in_openai_s_shape(
    gateway: Running, fake: ScriptedEngine
) -> None:
    """Anthropic's ``output_config.format`` is ``{type: json_schema, schema}``; the engines read
    OpenAI's ``response_format`` (``json_schema: {name, schema}``) and refused the other with a 400."""
    fake.queue(Script(content=['{"city": "Oslo"}']))
    reply = client(gateway).messages.parse(
        model="fake", max_tokens=50, messages=[{"role": "user", "content": "where?"}], output_format=City
    )
    assert reply.parsed_output == City(city="Oslo")
    sent = fake.requests[-1]["response_format"]
    assert sent["type"] == "json_schema" and set(sent) == {"type", "json_schema"}
    assert sent["json_schema"]["schema"]["properties"] == {"city": {"type": "string", "title": "City"}}
    with pytest.raises(anthropic.BadRequestError, match=r"output_config\.format"):
        client(gateway).messages.create(
            model="fake",
            max_tokens=50,
            messages=[{"role": "user", "content": "where?"}],
            output_config={"format": {"type": "yaml"}},  # type: ignore[typeddict-item]
        )


def test_models_in_anthropic_s_shape_for_anthropic_clients(gateway: Running) -> None:
    """The anthropic SDK sends ``anthropic-version``; its ``ModelInfo`` needs ``type``,
    ``display_name``, ``created_at`` and ``lifecycle``, its page ``has_more`` / ``first_id`` / ``last_id``."""
    page = gateway.http.get("/v1/models", headers={"anthropic-version": "2023-06-01"}).json()
    assert (page["has_more"], page["first_id"], page["last_id"]) == (False, "fake", "fake")
    for info in page["data"]:
        ModelInfo.model_validate(info)
    card = client(gateway).models.retrieve("fake")
    assert (card.type, card.display_name, card.lifecycle) == ("model", "fake", "active")
    assert [info.id for info in client(gateway).models.list()] == ["fake"]
    assert "has_more" not in gateway.http.get("/v1/models").json()  # OpenAI's shape without the header


def test_garbage_from_the_engine_is_an_error_event_not_a_crash() -> None:
    import asyncio

    from sparkfold.api.anthropic.stream import anthropic_sse
    from sparkfold.api.chat_stream import DONE

    async def batches():  # type: ignore[no-untyped-def]
        yield [b"[1, 2]", b"not json", DONE]

    async def collect() -> list[bytes]:
        return [event async for event in anthropic_sse(batches(), model="m", stop_sequences=None)]

    events = asyncio.run(collect())
    assert events[-1].startswith(b"event: error") and b"not a JSON object" in events[-1]


def test_misshapen_chunks_are_skipped_in_both_translations() -> None:
    import asyncio

    from sparkfold.api.anthropic.stream import anthropic_sse
    from sparkfold.api.chat_stream import DONE
    from sparkfold.api.responses.protocol import ResponsesRequest
    from sparkfold.api.responses.stream import responses_sse
    from sparkfold.api.responses.translate import response_object

    odd = [
        b'{"choices": [1, {"delta": "x"}, {"delta": {"content": 5, "reasoning_content": []}}]}',
        b'{"choices": "no"}',
    ]

    async def batches():  # type: ignore[no-untyped-def]
        yield [*odd, {"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]}, DONE]

    def skeleton(status, output, usage, finish):  # type: ignore[no-untyped-def]
        request = ResponsesRequest(input="x")
        return response_object(request, response_id="r", model="m", output=output, usage=usage, status=status)

    async def collect() -> tuple[list[bytes], list[bytes]]:
        a = [e async for e in anthropic_sse(batches(), model="m", stop_sequences=None)]
        r = [e async for e in responses_sse(batches(), skeleton=skeleton, on_done=lambda *x: None)]
        return a, r

    anthropic_events, responses_events = asyncio.run(collect())
    assert b'"text":"ok"' in b"".join(anthropic_events) and anthropic_events[-1].startswith(
        b"event: message_stop"
    )
    assert responses_events[-1].startswith(b"event: response.completed") and b'"delta":"ok"' in b"".join(
        responses_events
    )
