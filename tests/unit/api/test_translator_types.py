"""The translators under wrong JSON types: any value in any field is a 400 or a chat request, never a crash.

Hypothesis puts arbitrary JSON (nulls, booleans, numbers, strings, lists, objects) into every field
of the Anthropic Messages and OpenAI Responses request models, and into the items and blocks
inside them; the wire model refuses it (a 400 naming the field) or the translator turns it into
a chat request or an InvalidRequest (400). Nothing else may come out.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from sparkfold.api.anthropic import translate as anthropic
from sparkfold.api.anthropic.protocol import MessagesRequest
from sparkfold.api.errors import InvalidRequest
from sparkfold.api.responses import translate as responses
from sparkfold.api.responses.protocol import ResponsesRequest
from sparkfold.api.responses.tools import responses_tools
from sparkfold.api.sealed import ReasoningSeal
from sparkfold.protocol import ChatCompletionRequest

EXAMPLES = 200  # per test: about two seconds on a quiet machine, so CI runs them as they are

leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=6)
value = st.recursive(
    leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)


def typed_dict(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects whose values are anything, keyed by the names the translator reads (and others)."""
    return st.dictionaries(st.sampled_from(keys) | st.text(max_size=5), value, max_size=5)


def fields_of(
    model: type[BaseModel], inner: dict[str, st.SearchStrategy[Any]]
) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional={name: inner.get(name, value) for name in model.model_fields})


def _check(model: type[BaseModel], body: dict[str, Any], translate: Any) -> None:
    try:
        request = model.model_validate(body)
    except ValidationError:
        return  # the route answers 400 naming the field
    translated = translate(request)
    assert isinstance(translated, ChatCompletionRequest | InvalidRequest), translated
    if isinstance(translated, InvalidRequest):
        assert translated.status == 400 and translated.message


block = typed_dict(["type", "text", "source", "id", "name", "input", "tool_use_id", "content", "thinking"])
anthropic_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"]) | value},
    optional={"content": st.text(max_size=5) | st.lists(block, max_size=3) | value},
)
anthropic_fields = {
    "model": st.just("m") | value,
    "max_tokens": st.integers(1, 64) | value,
    "messages": st.lists(anthropic_message, min_size=1, max_size=3) | value,
    "tools": st.lists(typed_dict(["name", "description", "input_schema", "type"]), max_size=2) | value,
    "tool_choice": typed_dict(["type", "name", "disable_parallel_tool_use"]) | value,
    "thinking": typed_dict(["type", "budget_tokens"]) | value,
    "output_config": typed_dict(["effort", "format"]) | value,
    "system": st.text(max_size=5) | st.lists(block, max_size=2) | value,
}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(body=fields_of(MessagesRequest, anthropic_fields))
def test_messages_with_wrong_types_never_crash_the_translator(body: dict[str, Any]) -> None:
    _check(MessagesRequest, body, lambda request: anthropic.to_chat(request, ReasoningSeal()))


item = typed_dict(
    ["type", "role", "content", "text", "image_url", "call_id", "name", "arguments", "output", "id"]
)
responses_fields = {
    "model": st.just("m") | value,
    "input": st.text(max_size=5) | st.lists(item, max_size=3) | value,
    "tools": st.lists(typed_dict(["type", "name", "description", "parameters"]), max_size=2) | value,
    "tool_choice": st.sampled_from(["auto", "none", "required"]) | typed_dict(["type", "name"]) | value,
    "text": typed_dict(["format", "verbosity"]) | value,
    "reasoning": typed_dict(["effort", "summary"]) | value,
    "include": st.lists(st.text(max_size=8), max_size=2) | value,
}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(body=fields_of(ResponsesRequest, responses_fields))
def test_responses_with_wrong_types_never_crash_the_translator(body: dict[str, Any]) -> None:
    def translate(request: ResponsesRequest) -> object:
        tools = responses_tools(request.tools)
        if isinstance(tools, InvalidRequest):
            return tools
        return responses.to_chat(request, [], tools=tools, seal=ReasoningSeal())

    _check(ResponsesRequest, body, translate)
