"""Property: a generated Messages request is refused by the schema with a 400 naming a field, or
translates to a chat request or a 400 value; any chat reply translates back; nothing raises."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sparkfold.api.anthropic.protocol import MessagesRequest
from sparkfold.api.anthropic.translate import from_chat, to_chat
from sparkfold.api.errors import InvalidRequest, invalid_fields
from sparkfold.api.sealed import ReasoningSeal
from sparkfold.protocol import ChatCompletionRequest

json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
block_type = st.sampled_from(
    ["text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking", "document", "x"]
)
block = st.fixed_dictionaries(
    {"type": block_type},
    optional={
        "text": json_value,
        "source": st.fixed_dictionaries(
            {"type": st.sampled_from(["base64", "url", "file"])},
            optional={
                "media_type": st.sampled_from(["image/png", 3]),
                "data": st.text(max_size=8),
                "url": json_value,
            },
        ),
        "id": json_value,
        "name": json_value,
        "input": json_value,
        "tool_use_id": json_value,
        "content": st.text(max_size=5)
        | st.lists(
            st.dictionaries(st.sampled_from(["type", "text", "source"]), json_value, max_size=3), max_size=3
        ),
        "is_error": st.booleans(),
        "thinking": json_value,
    },
)
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant"]),
        "content": st.text(max_size=10) | st.lists(block, max_size=4),
    }
)
request = st.fixed_dictionaries(
    {
        "model": st.text(min_size=1, max_size=5),
        "max_tokens": st.integers(1, 10**6),
        "messages": st.lists(message, min_size=1, max_size=4),
    },
    optional={
        "system": st.text(max_size=5)
        | st.lists(st.dictionaries(st.sampled_from(["type", "text"]), json_value, max_size=2), max_size=2),
        "tools": st.lists(
            st.dictionaries(
                st.sampled_from(["name", "description", "input_schema", "type"]), json_value, max_size=4
            ),
            max_size=3,
        ),
        "tool_choice": st.dictionaries(
            st.sampled_from(["type", "name", "disable_parallel_tool_use"]), json_value, max_size=3
        ),
        "thinking": st.dictionaries(st.sampled_from(["type", "budget_tokens"]), json_value, max_size=2),
        "stop_sequences": st.lists(st.text(max_size=4), max_size=3),
        "output_config": st.dictionaries(st.sampled_from(["effort", "format"]), json_value, max_size=2),
        "stream": st.booleans(),
        "top_k": st.integers(0, 100),
        "container": json_value,
    },
)


# 200 examples: some seconds, so CI draws them at every run (the schema's drift shows there first)
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(body=request)
# a system part whose type is no string: the schema refuses it (sparkfold.protocol.Content)
@example(
    body={
        "model": "0",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": ""}],
        "system": [{"type": None}],
    }
)
def test_translation_never_raises(body: dict[str, Any]) -> None:
    try:
        parsed = MessagesRequest.model_validate(body)
    except ValidationError as exc:
        # the gateway answers a body its model refuses with this 400 (app.py, on_validation)
        refused = invalid_fields(exc.errors())
        assert refused.status == 400 and refused.param and refused.param.split(".")[0] in body
        return
    translated = to_chat(parsed, ReasoningSeal())
    assert isinstance(translated, ChatCompletionRequest | InvalidRequest)
    if isinstance(translated, InvalidRequest):
        assert translated.status == 400 and translated.message


reply_message = st.fixed_dictionaries(
    {},
    optional={
        "content": st.none() | st.text(max_size=5),
        "reasoning_content": st.none() | st.text(max_size=5),
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {
                    "id": st.text(max_size=3),
                    "function": st.fixed_dictionaries(
                        {"name": st.text(max_size=3), "arguments": st.text(max_size=10)}
                    ),
                }
            ),
            max_size=2,
        ),
    },
)


@settings(max_examples=300, deadline=None, database=None)
@given(
    message=reply_message,
    finish=st.sampled_from(["stop", "length", "tool_calls", None, "abort"]),
    usage=st.dictionaries(st.sampled_from(["prompt_tokens", "completion_tokens"]), st.integers(0, 100)),
)
def test_replies_translate_back(message: dict[str, Any], finish: str | None, usage: dict[str, int]) -> None:
    result = from_chat(
        {"choices": [{"message": message, "finish_reason": finish}], "usage": usage},
        model="m",
        stop_sequences=None,
        seal=ReasoningSeal(),
    )
    assert result["type"] == "message" and result["stop_reason"] in ("end_turn", "max_tokens", "tool_use")
