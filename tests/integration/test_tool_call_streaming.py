"""Tool calls as coding agents read them: streamed while they are generated, and a call cut by
``max_tokens`` returned partial, on the three APIs, through the real clients (the openai SDK, the
anthropic SDK, langchain-openai).

The path is the real one, model weights aside: the gateway (``sparkfold api``'s app) → the engine
server → the model's rendering and parsing with its tokenizer → a scripted reply, for each call
form the engines parse: GLM's (``sparkfold.glm``, the tiny GLM tokenizer,
:class:`tests.fakes.scripted_glm.ScriptedGlm`) and the demo model's ``<tool_call>`` JSON
(``sparkfold.engines.template_tools``, SmolLM2's tokenizer and chat template,
:class:`tests.fakes.scripted_template.ScriptedTemplate`). The number of tokens a call takes is
known, so "streamed" is checked by count: a call whose ``content`` argument takes N tokens reaches
the client in about N argument pieces, the first of which (with the call's name) went out when the
call was named, long before ``</tool_call>``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import pytest
from tests.fakes.harness import settings_for
from tests.fakes.scripted_engine import ServerThread
from tests.fakes.scripted_glm import ScriptedGlm
from tests.fakes.scripted_template import ScriptedTemplate
from tests.fakes.sdk_events import input_json_pieces

from sparkfold.api import create_app as create_gateway
from sparkfold.engines.server import create_app as create_engine
from sparkfold.engines.service import EngineService

TEXT = "The quick brown fox jumps over the lazy dog, again and again, until the evening comes.\n"
WRITE = {
    "name": "write_file",
    "description": "Write a file",
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
    },
}
TOOLS = [{"type": "function", "function": WRITE}]
ASK = [{"role": "user", "content": "Write notes.txt"}]
WORDS = "I will write it."
CUT_AFTER = "The quick brown fox"  # where a max_tokens cut falls
ARGUMENTS = {"path": "notes.txt", "content": TEXT}
BUDGET = 512  # the engine's reply budget: room for the forced calls' cap of JSON calls (40 tokens each)


def glm_call(path: str, content: str) -> str:
    return (
        f"<tool_call>write_file<arg_key>path</arg_key><arg_value>{path}</arg_value>"
        f"<arg_key>content</arg_key><arg_value>{content}</arg_value></tool_call>"
    )


def json_call(path: str, content: str) -> str:
    body = json.dumps({"name": "write_file", "arguments": {"path": path, "content": content}})
    return f"<tool_call>\n{body}\n</tool_call>\n"


@dataclass(frozen=True)
class Model:
    """A scripted model behind the gateway, and how it writes a reply."""

    name: str
    generator: ScriptedGlm | ScriptedTemplate
    call: Callable[[str, str], str]  # (path, content) -> the call as the model writes it
    opening: str  # what opens the answer ("</think>" ends GLM's reasoning)
    stop: str  # the stop token
    words: str  # the block type WORDS before the call become: "thinking" or "text"
    value: Callable[[str], str]  # a string value as the call's body spells it

    def script(self, *calls: str, words: str = "") -> str:
        return words + self.opening + "".join(calls) + self.stop

    def tokens(self, text: str) -> int:
        return len(self.generator.encode(text))


@pytest.fixture(scope="module", params=["glm", pytest.param("demo", marks=pytest.mark.slow)])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Model:
    if request.param == "glm":
        from sparkfold.testing.tiny_glm import write_tiny_glm

        glm = ScriptedGlm(write_tiny_glm(tmp_path_factory.mktemp("tiny-glm")), "")
        found = Model("glm", glm, glm_call, "</think>", "<|observation|>", "thinking", lambda text: text)
    else:  # the demo model's tokenizer and chat template (SmolLM2-135M), its calls in JSON
        smol = ScriptedTemplate(request.getfixturevalue("smol_dir"), "")
        found = Model("demo", smol, json_call, "", "<|im_end|>", "text", lambda text: json.dumps(text)[1:-1])
    found.generator.script = found.script(found.call("notes.txt", TEXT), words=WORDS)
    return found


@pytest.fixture(scope="module")
def url(model: Model) -> Iterator[str]:
    service = EngineService(model.generator, served_name=model.name, max_tokens=BUDGET)
    with ServerThread(create_engine(service)) as engine:
        port = int(engine.url.rsplit(":", 1)[1])
        with ServerThread(create_gateway(settings_for(port))) as gateway:
            yield gateway.url


@pytest.fixture(scope="module")
def oai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def claude(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=60)


def value_tokens(model: Model) -> int:
    """Tokens of the ``content`` value: at least this many argument pieces when it streams."""
    return model.tokens(model.value(TEXT)) - 2  # a multi-byte or escaped character may join two


def cut(model: Model) -> int:
    """A ``max_tokens`` that ends the reply inside the call's ``content`` value."""
    script: str = model.generator.script
    return model.tokens(script[: script.index(CUT_AFTER) + len(CUT_AFTER)])


CLAUDE_TOOLS: Any = [{"name": WRITE["name"], "input_schema": WRITE["parameters"]}]
ANY: Any = {"type": "any"}
RESPONSES_TOOLS: Any = [{"type": "function", **WRITE}]


# --- the call streams ------------------------------------------------------------------------------


def test_openai_chat_streams_the_call_as_it_is_generated(oai: openai.OpenAI, model: Model) -> None:
    stream = oai.chat.completions.create(model=model.name, messages=ASK, tools=TOOLS, stream=True)  # type: ignore[arg-type]
    chunks = [c for c in stream if c.choices]
    calls = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
    first, rest = calls[0], calls[1:]
    assert first.index == 0 and first.id and first.type == "function"
    assert first.function is not None and first.function.name == "write_file"
    assert len(rest) >= value_tokens(model) and all(c.id is None and c.index == 0 for c in rest)
    assert json.loads("".join((c.function and c.function.arguments) or "" for c in calls)) == ARGUMENTS
    assert not [c for c in chunks[1:] if c.choices[0].delta.content == ""]  # no empty deltas after the role
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_anthropic_streams_input_json_deltas(claude: anthropic.Anthropic, model: Model) -> None:
    with claude.messages.stream(
        model=model.name,
        max_tokens=256,
        messages=ASK,
        tools=CLAUDE_TOOLS,
        tool_choice=ANY,  # type: ignore[arg-type]
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    starts = [e for e in events if e.type == "content_block_start" and e.content_block.type == "tool_use"]
    assert len(starts) == 1 and starts[0].content_block.input == {}
    pieces = input_json_pieces(events)
    assert len(pieces) >= value_tokens(model)
    (use,) = [b for b in final.content if b.type == "tool_use"]
    assert (use.name, use.input) == ("write_file", ARGUMENTS) and final.stop_reason == "tool_use"


def test_responses_streams_function_call_arguments(oai: openai.OpenAI, model: Model) -> None:
    stream = oai.responses.create(model=model.name, input=ASK, tools=RESPONSES_TOOLS, stream=True)  # type: ignore[arg-type]
    events = list(stream)
    pieces = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(pieces) >= value_tokens(model)
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(done.arguments) == ARGUMENTS and events[-1].type == "response.completed"


def test_langchain_streams_tool_call_chunks(url: str, model: Model) -> None:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(model=model.name, base_url=f"{url}/v1", api_key="unused", max_retries=0)  # type: ignore[arg-type]
    chunks = list(chat.bind_tools([WRITE], tool_choice="required").stream("Write notes.txt"))
    pieces = [t for c in chunks for t in c.tool_call_chunks]
    assert pieces[0]["name"] == "write_file" and len(pieces) >= value_tokens(model)
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk  # type: ignore[assignment]
    assert [(t["name"], t["args"]) for t in whole.tool_calls] == [("write_file", ARGUMENTS)]


# --- a call cut by max_tokens comes back partial --------------------------------------------------------

PARTIAL = '{"path": "notes.txt", "content": "The quick brown fox'


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat_returns_a_cut_call(oai: openai.OpenAI, model: Model, stream: bool) -> None:
    body: Any = {"model": model.name, "messages": ASK, "tools": TOOLS, "max_tokens": cut(model)}
    if stream:
        chunks = [c for c in oai.chat.completions.create(**body, stream=True) if c.choices]
        calls = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
        name = calls[0].function.name if calls[0].function else None
        arguments = "".join((c.function and c.function.arguments) or "" for c in calls)
        finish = chunks[-1].choices[0].finish_reason
    else:
        reply = oai.chat.completions.create(**body)
        (call,) = reply.choices[0].message.tool_calls or []
        name, arguments, finish = call.function.name, call.function.arguments, reply.choices[0].finish_reason  # type: ignore[union-attr]
    assert (name, arguments, finish) == ("write_file", PARTIAL, "length")


def test_anthropic_returns_a_cut_tool_use(claude: anthropic.Anthropic, model: Model) -> None:
    body: Any = {"model": model.name, "max_tokens": cut(model), "messages": ASK, "tools": CLAUDE_TOOLS}
    message = claude.messages.create(**body)
    (use,) = [b for b in message.content if b.type == "tool_use"]
    assert use.name == "write_file" and use.input == json.loads(PARTIAL + '"}')  # as far as it was written
    assert message.stop_reason == "max_tokens"
    with claude.messages.stream(**body) as stream:
        events = list(stream)
        streamed = stream.get_final_message()
    pieces = input_json_pieces(events)
    assert "".join(pieces) == PARTIAL and streamed.stop_reason == "max_tokens"
    assert [b.type for b in streamed.content] == [model.words, "tool_use"]


@pytest.mark.parametrize("stream", [False, True])
def test_responses_returns_a_cut_function_call(oai: openai.OpenAI, model: Model, stream: bool) -> None:
    body: Any = {"model": model.name, "input": ASK, "tools": RESPONSES_TOOLS, "max_output_tokens": cut(model)}
    if stream:
        events = list(oai.responses.create(**body, stream=True))
        assert events[-1].type == "response.incomplete"  # the API's terminal event for the status
        response = events[-1].response
    else:
        response = oai.responses.create(**body)
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert (call.name, call.arguments, call.status) == ("write_file", PARTIAL, "incomplete")
    assert response.status == "incomplete" and response.incomplete_details is not None


def test_langchain_sees_a_cut_call_as_invalid(url: str, model: Model) -> None:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        model=model.name, base_url=f"{url}/v1", api_key="unused", max_retries=0, max_tokens=cut(model)
    )  # type: ignore[arg-type,call-arg]
    reply = chat.bind_tools([WRITE]).invoke("Write notes.txt")
    assert [(t["name"], t["args"]) for t in reply.invalid_tool_calls] == [("write_file", PARTIAL)]
    assert reply.response_metadata["finish_reason"] == "length"


# --- forced parallel calls end -------------------------------------------------------------------


def test_an_identical_call_ends_the_reply(
    oai: openai.OpenAI, model: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = model.script(*[model.call("a.txt", "x")] * 5)
    monkeypatch.setattr(model.generator, "script", script)
    chunks = list(
        oai.chat.completions.create(
            model=model.name,
            messages=ASK,
            tools=TOOLS,  # type: ignore[arg-type]
            tool_choice="required",
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert {c.index for c in calls} == {0}  # the repeats were never sent
    assert json.loads("".join((c.function and c.function.arguments) or "" for c in calls))["path"] == "a.txt"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    used = chunks[-1].usage
    assert used is not None and used.completion_tokens < model.tokens(script) // 2  # the engine stopped


def test_forced_calls_stop_at_the_cap(
    claude: anthropic.Anthropic, model: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparkfold.config import FORCED_CALLS_PER_TOOL

    paths = [f"f{n}.txt" for n in range(FORCED_CALLS_PER_TOOL + 4)]
    script = model.script(*(model.call(path, "x") for path in paths))
    monkeypatch.setattr(model.generator, "script", script)
    message = claude.messages.create(
        model=model.name, max_tokens=BUDGET, messages=ASK, tools=CLAUDE_TOOLS, tool_choice=ANY
    )
    uses = [b.input["path"] for b in message.content if b.type == "tool_use"]  # type: ignore[index]
    assert uses == paths[:FORCED_CALLS_PER_TOOL] and message.stop_reason == "tool_use"
