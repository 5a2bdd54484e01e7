"""The clients people put on an OpenAI/Anthropic endpoint, against the gateway and a real engine.

Each test runs twice: on the demo model (SmolLM2-135M through its chat template) and on the tiny
GLM-5.3 fixture (random weights: whatever it extracts, the grammar forced). The engine is
`sparkfold engine` in a child process, the gateway runs in this process; one of each per model,
shared by the module. The extracted model keeps every field bounded (an enum, a small integer, a
boolean, a short string), so a forced reply ends within the token budget even on random weights.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anthropic
import httpx
import openai
import pytest
from engine_procs import free_port, serving, write_config
from pydantic import BaseModel, Field
from tests.fakes.harness import settings_for
from tests.fakes.scripted_engine import ServerThread

from sparkfold.api import create_app

pytestmark = pytest.mark.slow

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM fetches a price list otherwise

GREEDY = {"temperature": 0}  # the anthropic SDK has no temperature argument any more
BUDGET = 200  # tokens: more than any forced reply of Forecast needs
ASK = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]


class Forecast(BaseModel):
    """A weather forecast."""

    city: str = Field(max_length=6)
    unit: Literal["C", "F"]
    days: int = Field(ge=1, le=7)
    sunny: bool


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": Forecast.model_json_schema(),
    },
}
CLOCK = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}


@dataclass(frozen=True)
class Served:
    kind: str
    name: str
    url: str

    def oai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=300)

    def claude(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key="unused", max_retries=0, timeout=300)

    def langchain(self, max_tokens: int = BUDGET, **options: Any) -> Any:
        """langchain-openai's ``ChatOpenAI`` on the gateway, greedy."""
        from langchain_openai import ChatOpenAI

        return ChatOpenAI(
            model=self.name,
            base_url=f"{self.url}/v1",
            api_key="unused",  # type: ignore[arg-type]
            max_tokens=max_tokens,  # type: ignore[call-arg]
            temperature=0,
            max_retries=0,
            **options,
        )


GATEWAY: dict[str, Any] = {
    "parallel": 2,
    "max_queued": 4,
    "keepalive_s": 30,
    "model_aliases": ["claude-*", "gpt-*"],  # as the example inventory sets them
}


@pytest.fixture(scope="module", params=["demo", "glm"])
def served(
    request: pytest.FixtureRequest, smol_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    directory = tmp_path_factory.mktemp(f"clients-{request.param}")
    if request.param == "glm":
        from sparkfold.testing.tiny_glm import write_tiny_glm

        model, engine = write_tiny_glm(directory / "model"), {"thinking": False}
    else:
        model, engine = smol_dir, {}
    port = free_port()
    name = f"{request.param}-model"
    config = write_config(
        directory / "sparkfold.toml", model, port=port, served_name=name, max_tokens=BUDGET, **engine
    )
    with (
        serving(config, directory / "engine.log", port),
        ServerThread(create_app(settings_for(port, served_name=name, **GATEWAY))) as gateway,
    ):
        yield Served(request.param, name, gateway.url)


def _forecast(arguments: str | dict[str, Any]) -> Forecast:
    """Strict: JSON without raw control characters, every field valid."""
    data = json.loads(arguments, strict=True) if isinstance(arguments, str) else arguments
    return Forecast.model_validate(data)


# --- agent frameworks: a small pydantic model, extracted ------------------------------------------


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_extracts_the_model(served: Served, mode: str) -> None:
    import instructor

    client = instructor.from_openai(served.oai(), mode=getattr(instructor.Mode, mode))
    forecast = client.chat.completions.create(
        model=served.name,
        response_model=Forecast,
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=BUDGET,
        temperature=0,
        max_retries=0,
    )
    assert isinstance(forecast, Forecast) and 1 <= forecast.days <= 7


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_langchain_with_structured_output(served: Served, method: str) -> None:
    chat = served.langchain()
    forecast = chat.with_structured_output(Forecast, method=method).invoke(ASK[0]["content"])  # type: ignore[arg-type]
    assert isinstance(forecast, Forecast)


def test_pydantic_ai_tool_output(served: Served) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(
        served.name, provider=OpenAIProvider(base_url=f"{served.url}/v1", api_key="unused")
    )
    agent = Agent(model, output_type=Forecast, retries=0)
    result = agent.run_sync(ASK[0]["content"], model_settings={"max_tokens": BUDGET, "temperature": 0})
    assert isinstance(result.output, Forecast)


def test_litellm_forced_tool_call(served: Served) -> None:
    import litellm

    reply = litellm.completion(
        model=f"openai/{served.name}",
        api_base=f"{served.url}/v1",
        api_key="unused",
        messages=ASK,
        tools=[WEATHER, CLOCK],
        tool_choice="required",
        max_tokens=BUDGET,
        temperature=0,
    )
    calls = reply.choices[0].message.tool_calls  # type: ignore[union-attr]
    assert calls and {c.function.name for c in calls} <= {"get_weather", "get_time"}
    for call in calls:
        if call.function.name == "get_weather":
            _forecast(call.function.arguments)


# --- forced tool calls: OpenAI and Anthropic spellings ---------------------------------------------


def test_openai_named_tool_and_a_single_call(served: Served) -> None:
    reply = served.oai().chat.completions.create(
        model=served.name,
        messages=ASK,  # type: ignore[arg-type]
        tools=[CLOCK, WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
        max_tokens=BUDGET,
        temperature=0,
    )
    (call,) = reply.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    _forecast(call.function.arguments)  # type: ignore[union-attr]
    assert reply.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(
    "choice", [{"type": "any", "disable_parallel_tool_use": True}, {"type": "tool", "name": "get_weather"}]
)
def test_anthropic_forced_tool_use(served: Served, choice: dict[str, Any]) -> None:
    tools = [
        {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}  # type: ignore[index]
        for t in (WEATHER, CLOCK)
    ]
    message = served.claude().messages.create(
        model=served.name,
        max_tokens=BUDGET,
        messages=ASK,  # type: ignore[arg-type]
        tools=tools,  # type: ignore[arg-type]
        tool_choice=choice,  # type: ignore[arg-type]
        extra_body=GREEDY,
    )
    uses = [block for block in message.content if block.type == "tool_use"]
    assert len(uses) == 1 and message.stop_reason == "tool_use"
    if choice["type"] == "tool":
        assert uses[0].name == "get_weather"
    if uses[0].name == "get_weather":
        _forecast(uses[0].input)  # type: ignore[arg-type]


# --- structured output, text parts, usage, Anthropic fidelity --------------------------------------


def test_structured_output_is_strict_json(served: Served) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "forecast", "schema": Forecast.model_json_schema()}}
    for seed in range(3):
        reply = served.oai().chat.completions.create(
            model=served.name,
            messages=ASK,  # type: ignore[arg-type]
            response_format=fmt,  # type: ignore[arg-type]
            max_tokens=BUDGET,
            temperature=1.0,
            seed=seed,
        )
        assert reply.choices[0].finish_reason == "stop"
        _forecast(reply.choices[0].message.content or "")


class Sky(BaseModel):
    """Only bounded fields the anthropic SDK keeps: its ``output_format`` drops ``maxLength`` and
    ``maximum`` from the schema it sends (into the description), so they could not bound a reply."""

    unit: Literal["C", "F"]
    sunny: bool


def test_anthropic_structured_output(served: Served) -> None:
    """``messages.parse(output_format=...)`` sends ``output_config.format``; the grammar forces it."""
    message = served.claude().messages.parse(
        model=served.name,
        max_tokens=BUDGET,
        messages=ASK,  # type: ignore[arg-type]
        output_format=Sky,
        extra_body=GREEDY,
    )
    assert message.stop_reason == "end_turn"
    assert isinstance(message.parsed_output, Sky)
    text = "".join(block.text for block in message.content if block.type == "text")
    Sky.model_validate(json.loads(text, strict=True))


def test_content_as_text_parts(served: Served) -> None:
    parts = [{"type": "text", "text": "Say hello"}, {"type": "text", "text": " to Paris."}]
    reply = served.oai().chat.completions.create(
        model=served.name,
        messages=[{"role": "user", "content": parts}],  # type: ignore[list-item]
        max_tokens=8,
        temperature=0,
    )
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    message = served.claude().messages.create(
        model=served.name,
        max_tokens=8,
        system=[{"type": "text", "text": "Be brief."}],
        messages=[{"role": "user", "content": parts}],  # type: ignore[list-item]
    )
    assert message.usage.output_tokens > 0


def test_usage_comes_once_on_the_last_chunk(served: Served) -> None:
    stream = served.oai().chat.completions.create(
        model=served.name,
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    with_usage = [c for c in chunks if c.usage is not None]
    assert with_usage == [chunks[-1]] and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 8  # type: ignore[union-attr]

    chat = served.langchain(max_tokens=8, stream_usage=True)
    total = None
    for piece in chat.stream("Say hello."):
        total = piece if total is None else total + piece
    assert total is not None and total.usage_metadata is not None
    assert total.usage_metadata["output_tokens"] == 8


def test_reasoning_tokens_are_counted(served: Served) -> None:
    if served.kind != "glm":
        pytest.skip("the demo model does not reason")
    reply = served.oai().chat.completions.create(
        model=served.name,
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=12,
        extra_body={"chat_template_kwargs": {"enable_thinking": True}},
    )
    usage = reply.usage
    assert usage is not None and usage.completion_tokens_details is not None
    # random weights never close the think block: every reply token is reasoning
    assert usage.completion_tokens_details.reasoning_tokens == usage.completion_tokens == 12


def test_logprobs_and_several_choices(served: Served) -> None:
    oai = served.oai()
    ask: Any = functools.partial(oai.chat.completions.create, model=served.name, messages=ASK, max_tokens=4)
    reply = ask(temperature=1.0, seed=1, n=2, logprobs=True, top_logprobs=2)
    assert [c.index for c in reply.choices] == [0, 1]
    described = 0
    for choice in reply.choices:
        content = (choice.logprobs.content if choice.logprobs else None) or []
        described += len(content)
        for entry in content:
            assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
            assert entry.top_logprobs[0].logprob >= max(entry.logprob, entry.top_logprobs[1].logprob)
    assert reply.usage is not None and 0 < described <= reply.usage.completion_tokens <= 8

    chunks = list(ask(temperature=0, logprobs=True, stream=True, stream_options={"include_usage": True}))
    streamed = sum(
        len(c.choices[0].logprobs.content or []) for c in chunks if c.choices and c.choices[0].logprobs
    )
    assert 0 < streamed <= chunks[-1].usage.completion_tokens  # type: ignore[union-attr]

    several = list(ask(temperature=1.0, seed=1, n=2, stream=True, stream_options={"include_usage": True}))
    finished = {
        c.choices[0].index: c.choices[0].finish_reason
        for c in several
        if c.choices and c.choices[0].finish_reason
    }
    assert finished.keys() == {0, 1}, several  # each choice streams to its own end
    usages = [c.usage for c in several if c.usage is not None]
    assert len(usages) == 1 and several[-1].usage is usages[0] and not several[-1].choices
    assert 2 <= usages[0].completion_tokens <= 8  # both choices counted, once

    texts = oai.completions.create(
        model=served.name, prompt=["Hello", "The sky is"], max_tokens=3, echo=True, n=2, temperature=0
    )
    assert [c.index for c in texts.choices] == [0, 1, 2, 3]
    assert texts.choices[0].text.startswith("Hello") and texts.choices[2].text.startswith("The sky is")
    assert texts.choices[0].text == texts.choices[1].text  # greedy: both choices alike
    scored = oai.completions.create(
        model=served.name, prompt="Hello", max_tokens=3, logprobs=2, temperature=0
    )
    logprobs = scored.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.token_logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.text_offset or [])
    assert scored.usage is not None and len(logprobs.tokens) <= scored.usage.completion_tokens
    assert all(len(top) <= 2 for top in logprobs.top_logprobs or [])


def test_anthropic_stop_sequence_ids_and_token_counts(served: Served) -> None:
    claude = served.claude()
    plain = claude.messages.create(model=served.name, max_tokens=12, messages=ASK, extra_body=GREEDY)  # type: ignore[arg-type]
    assert plain.id.startswith("msg_")
    text = "".join(block.text for block in plain.content if block.type == "text")
    words = [w for w in text.split() if len(w) > 2]
    if not words:
        pytest.skip(f"the greedy reply has no word to stop on: {text!r}")
    stopped = claude.messages.create(
        model=served.name,
        max_tokens=12,
        messages=ASK,
        extra_body=GREEDY,
        stop_sequences=["zzzq", words[0]],  # type: ignore[arg-type]
    )
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", words[0])

    with claude.messages.stream(model=served.name, max_tokens=4, messages=ASK) as stream:  # type: ignore[arg-type]
        events = list(stream)
    start = events[0]
    assert start.type == "message_start" and start.message.id.startswith("msg_")
    prompt = plain.usage.input_tokens + (plain.usage.cache_read_input_tokens or 0)  # cached: read, not input
    assert start.message.usage.input_tokens + (start.message.usage.cache_read_input_tokens or 0) == prompt > 0

    counted = claude.messages.count_tokens(model=served.name, messages=ASK)  # type: ignore[arg-type]
    tools = [{"name": "get_weather", "input_schema": Forecast.model_json_schema()}]
    with_tools = claude.messages.count_tokens(model=served.name, messages=ASK, tools=tools)  # type: ignore[arg-type]
    assert counted.input_tokens == prompt
    assert with_tools.input_tokens > counted.input_tokens


def test_model_card_and_single_rank_health(served: Served) -> None:
    oai = served.oai()
    card = oai.models.retrieve(served.name)
    assert card.id == served.name
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("no-such-model")
    health = httpx.get(f"{served.url}/health", timeout=30).json()
    assert health["engine"]["ok"] and health["peer"] is None  # docs/api.md: null on one rank


def test_the_agents_default_model_names_answer(served: Served) -> None:
    """Claude Code and Codex ask for their vendor's models unless told otherwise: with
    ``[api] model_aliases`` the served model answers them, and only them (the engine's 404 for the
    rest)."""
    ask: Any = [{"role": "user", "content": "Hi"}]
    claude = served.claude().messages.create(model="claude-opus-5-5", max_tokens=4, messages=ask)
    assert claude.model == "claude-opus-5-5" and claude.usage.output_tokens > 0
    oai = served.oai()
    chat = oai.chat.completions.create(model="gpt-5.5-codex", max_tokens=4, messages=ask, **GREEDY)
    assert chat.choices[0].finish_reason in ("stop", "length")
    assert oai.responses.create(model="gpt-5.5", input="Hi", max_output_tokens=4).usage is not None
    assert [card.id for card in oai.models.list()] == [served.name, "claude-*", "gpt-*"]
    assert oai.models.retrieve("claude-haiku-4-5").id == "claude-haiku-4-5"
    with pytest.raises(openai.NotFoundError, match=served.name):
        oai.chat.completions.create(model="llama-3", max_tokens=4, messages=ask)


# --- the SDKs' stream helpers and streamed agent frameworks ----------------------------------------

NAMED = {"type": "function", "function": {"name": "get_weather"}}


def test_openai_parse_and_stream_helpers(served: Served) -> None:
    """``chat.completions.parse`` / ``.stream`` and ``responses.stream`` build the pydantic model
    (or the parsed tool arguments) from what they received."""
    chat = served.oai().chat.completions
    parsed = chat.parse(
        model=served.name,
        messages=ASK,
        response_format=Forecast,
        max_tokens=BUDGET,
        temperature=0,  # type: ignore[arg-type]
    )
    assert isinstance(parsed.choices[0].message.parsed, Forecast)
    tool = openai.pydantic_function_tool(Forecast, name="get_weather")
    with chat.stream(
        model=served.name,
        messages=ASK,
        tools=[tool],
        tool_choice=NAMED,
        max_tokens=BUDGET,
        temperature=0,  # type: ignore[arg-type, list-item]
    ) as stream:
        kinds = {event.type for event in stream}
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in kinds
    (call,) = final.choices[0].message.tool_calls or []
    assert isinstance(call.function.parsed_arguments, Forecast)
    with served.oai().responses.stream(
        model=served.name,
        input=ASK[0]["content"],
        text_format=Forecast,
        max_output_tokens=BUDGET,
        temperature=0,
    ) as events:
        response = events.get_final_response()
    assert response.status == "completed" and isinstance(response.output_parsed, Forecast)


def test_anthropic_stream_helper_with_a_forced_tool(served: Served) -> None:
    tools = [{"name": "get_weather", "input_schema": Forecast.model_json_schema()}]
    with served.claude().messages.stream(
        model=served.name,
        max_tokens=BUDGET,
        messages=ASK,  # type: ignore[arg-type]
        tools=tools,  # type: ignore[arg-type]
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body=GREEDY,
    ) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        message = stream.get_final_message()
    assert "input_json_delta" in deltas and message.stop_reason == "tool_use"
    (use,) = [block for block in message.content if block.type == "tool_use"]
    _forecast(use.input)  # type: ignore[arg-type]
    with served.claude().messages.stream(model=served.name, max_tokens=8, messages=ASK) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "".join(b.text for b in final.content if b.type == "text")
    assert final.usage.output_tokens > 0


# LiteLLM 1.110's own types warn (once a process) from inside its stream handler: under pytest an error
@pytest.mark.filterwarnings(r"ignore:Item '\w+' on TypedDict class:UserWarning")
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_litellm_streams_a_forced_tool_call(served: Served, provider: str) -> None:
    """LiteLLM's ``openai/`` provider on /v1, and its ``anthropic/`` provider on /v1/messages."""
    import litellm

    base = f"{served.url}/v1" if provider == "openai" else served.url
    chunks = list(
        litellm.completion(
            model=f"{provider}/{served.name}",
            api_base=base,
            api_key="unused",
            messages=ASK,
            tools=[WEATHER],
            tool_choice=NAMED,
            max_tokens=BUDGET,
            temperature=0,
            stream=True,
        )
    )
    message = litellm.stream_chunk_builder(chunks).choices[0].message  # type: ignore[union-attr]
    (call,) = message.tool_calls
    assert call.function.name == "get_weather"
    _forecast(call.function.arguments)


def test_langchain_bind_tools_astream(served: Served) -> None:
    import asyncio

    bound = served.langchain(stream_usage=True).bind_tools([WEATHER], tool_choice="get_weather")

    async def gather() -> Any:
        total = None
        async for piece in bound.astream(ASK[0]["content"]):
            total = piece if total is None else total + piece
        return total

    total = asyncio.run(gather())
    (call,) = total.tool_calls
    assert call["name"] == "get_weather"
    _forecast(call["args"])
    assert total.usage_metadata["output_tokens"] > 0


def test_pydantic_ai_run_stream(served: Served) -> None:
    import asyncio

    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(
        served.name, provider=OpenAIProvider(base_url=f"{served.url}/v1", api_key="unused")
    )
    agent = Agent(model, output_type=Forecast, retries=0)

    async def run() -> Forecast:
        settings = {"max_tokens": BUDGET, "temperature": 0}
        async with agent.run_stream(ASK[0]["content"], model_settings=settings) as result:  # type: ignore[arg-type]
            return await result.get_output()

    assert isinstance(asyncio.run(run()), Forecast)
