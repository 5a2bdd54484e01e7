"""The Messages request shapes Claude Code sends, through the gateway with the official anthropic SDK.

Claude Code (2.1.332) sends ``role: "system"`` entries inside ``messages``, ``output_config.effort``,
``thinking: {type: "adaptive", display: "omitted"}`` and ``context_management`` with a
``clear_thinking_20251015`` edit, and sends the omitted thinking blocks back on the next turn.
The scripted engine stands in for the model.
"""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
from tests.fakes.harness import Running
from tests.fakes.scripted_engine import Script, ScriptedEngine

from sparkfold.api.ignored_tools import IGNORED_TOOLS_HEADER

TOOL = {"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {}}}
KEEP_ALL = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}


def client(gateway: Running) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0)


def claude_code_request(messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {
        "model": "fake",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "You are Claude Code."}],
        "messages": messages,
        "tools": [TOOL],
        "thinking": {"type": "adaptive", "display": "omitted"},
        "output_config": {"effort": "high"},
        "extra_body": {"context_management": KEEP_ALL},
        **fields,
    }


FIRST = [
    {"role": "user", "content": [{"type": "text", "text": "hello"}]},
    {"role": "system", "content": [{"type": "text", "text": "<env>cwd: /tmp</env>"}]},
    {"role": "user", "content": "Say hello in one word."},
]


def test_system_entries_render_in_place_and_thinking_is_omitted(
    gateway: Running, fake: ScriptedEngine
) -> None:
    fake.queue(Script(reasoning=["greet"], content=["Hello"]))
    reply = client(gateway).messages.create(**claude_code_request(FIRST))
    sent = fake.requests[-1]
    assert [(m["role"], m["content"]) for m in sent["messages"]] == [
        ("system", "You are Claude Code."),
        ("user", [{"type": "text", "text": "hello"}]),
        ("system", "<env>cwd: /tmp</env>"),
        ("user", "Say hello in one word."),
    ]
    assert sent["reasoning_effort"] == "high"
    assert sent["chat_template_kwargs"] == {"enable_thinking": True, "clear_thinking": False}
    thinking, text = reply.content
    assert thinking.type == "thinking" and thinking.thinking == "" and thinking.signature
    assert text.type == "text" and text.text == "Hello"


@pytest.mark.parametrize(("effort", "sent"), [("low", "low"), ("medium", "high"), ("max", "max")])
def test_output_config_effort_maps_onto_glm_efforts(
    gateway: Running, fake: ScriptedEngine, effort: str, sent: str
) -> None:
    client(gateway).messages.create(**claude_code_request(FIRST, output_config={"effort": effort}))
    assert fake.requests[-1]["reasoning_effort"] == sent


def test_omitted_thinking_streams_only_its_signature(gateway: Running, fake: ScriptedEngine) -> None:
    fake.queue(Script(reasoning=["gr", "eet"], content=["Hello"]))
    with client(gateway).messages.stream(**claude_code_request(FIRST)) as stream:
        kinds = [event.delta.type for event in stream if event.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "thinking_delta" not in kinds and kinds.count("signature_delta") == 1
    thinking = final.content[0]
    assert thinking.type == "thinking" and thinking.thinking == "" and thinking.signature


@pytest.mark.parametrize("stream", [False, True])
def test_omitted_thinking_sent_back_is_restored(gateway: Running, fake: ScriptedEngine, stream: bool) -> None:
    """The second turn of a tool loop: the omitted thinking comes back by its signature."""
    fake.queue(Script(reasoning=["use bash"], content=[], tool_calls=[("Bash", "{}")]))
    api = client(gateway).messages
    if stream:
        with api.stream(**claude_code_request(FIRST)) as events:
            first = events.get_final_message()
    else:
        first = api.create(**claude_code_request(FIRST))
    thinking, call = (block.model_dump(exclude_none=True) for block in first.content)
    assert thinking["thinking"] == ""
    turn = [
        *FIRST,
        {"role": "assistant", "content": [thinking, call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "ok"}]},
    ]
    api.create(**claude_code_request(turn))
    assistant = fake.requests[-1]["messages"][4]
    assert assistant["role"] == "assistant" and assistant["reasoning_content"] == "use bash"


def test_clear_thinking_keeps_the_last_turns_thinking(gateway: Running, fake: ScriptedEngine) -> None:
    """``keep: {type: thinking_turns, value: 1}``: the older turns' thinking is removed, the last
    turn's rendered (the template's own rule is turned off)."""
    turns = [
        {"role": "user", "content": "one"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "old", "signature": "x"},
                {"type": "text", "text": "a"},
            ],
        },
        {"role": "user", "content": "two"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "new", "signature": "x"},
                {"type": "text", "text": "b"},
            ],
        },
        {"role": "user", "content": "three"},
    ]
    keep_one = {
        "edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}]
    }
    client(gateway).messages.create(**claude_code_request(turns, extra_body={"context_management": keep_one}))
    sent = fake.requests[-1]
    assert [m.get("reasoning_content") for m in sent["messages"] if m["role"] == "assistant"] == [None, "new"]
    assert sent["chat_template_kwargs"]["clear_thinking"] is False


def test_other_context_edits_are_logged_not_refused(
    gateway: Running, fake: ScriptedEngine, caplog: pytest.LogCaptureFixture
) -> None:
    edits = {"edits": [{"type": "clear_tool_uses_20250919"}]}
    with caplog.at_level("INFO"):
        client(gateway).messages.create(
            **claude_code_request(FIRST, extra_body={"context_management": edits})
        )
    assert "clear_thinking" not in fake.requests[-1].get("chat_template_kwargs", {})
    (record,) = [r for r in caplog.records if r.getMessage().startswith("ignored context_management edits")]
    assert record.edits == ["clear_tool_uses_20250919"]  # type: ignore[attr-defined]


def test_an_altered_signature_of_this_server_is_a_400(gateway: Running, fake: ScriptedEngine) -> None:
    fake.queue(Script(reasoning=["plan"], content=["a"]))
    signature = client(gateway).messages.create(**claude_code_request(FIRST)).content[0].signature  # type: ignore[union-attr]
    altered = signature[:-2] + ("AA" if not signature.endswith("AA") else "BB")
    body = claude_code_request(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "", "signature": altered}]},
            {"role": "user", "content": "again"},
        ]
    )
    with pytest.raises(anthropic.BadRequestError, match=r"messages\[1\]\.content\[0\]\.signature"):
        client(gateway).messages.create(**body)


def test_another_servers_signature_is_not_read(gateway: Running, fake: ScriptedEngine) -> None:
    """A conversation begun on Anthropic's API carries their signatures: the text counts."""
    body = claude_code_request(
        [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": "t", "signature": "EqQBCkYIBx"}],
            },
            {"role": "user", "content": "again"},
        ],
        extra_body={"context_management": KEEP_ALL},
    )
    client(gateway).messages.create(**body)
    assert fake.requests[-1]["messages"][2]["reasoning_content"] == "t"


def test_server_tools_are_not_offered_and_are_named(gateway: Running, fake: ScriptedEngine) -> None:
    tools = [TOOL, {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]
    raw = client(gateway).messages.with_raw_response.create(**claude_code_request(FIRST, tools=tools))
    assert raw.headers[IGNORED_TOOLS_HEADER] == "web_search_20250305:web_search"
    assert [tool["function"]["name"] for tool in fake.requests[-1]["tools"]] == ["Bash"]
    counted = client(gateway).messages.with_raw_response.count_tokens(
        model="fake",
        messages=FIRST,
        tools=tools,  # type: ignore[arg-type]
    )
    assert counted.headers[IGNORED_TOOLS_HEADER] == "web_search_20250305:web_search"
