"""Golden prompts: sparkfold's template against the reference layout, token for token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sparkfold.glm.errors import RenderError
from sparkfold.glm.render import PromptRenderer, prompt_options
from sparkfold.glm.tokens import PUBLISHED_BASE_ID, SPECIAL_TOKENS
from sparkfold.testing.tiny_glm import SPECIAL_BASE

# Reference ids (glm.md section 4) that a rendered prompt may contain.
REFERENCE_IDS = {
    "<|endoftext|>": 154820,
    "<|user|>": 154827,
    "<|observation|>": 154829,
    "<|begin_of_image|>": 154830,
    "<|end_of_image|>": 154831,
    "<|begin_of_video|>": 154832,
    "<|end_of_video|>": 154833,
    "<tool_call>": 154843,
    "</tool_call>": 154844,
    "<arg_key>": 154847,
    "</arg_key>": 154848,
    "<arg_value>": 154849,
    "</arg_value>": 154850,
    "<|image|>": 154854,
    "<|video|>": 154855,
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
            "strict": True,
        },
    }
]
TOOLS_BLOCK = (
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(
        {k: v for k, v in TOOLS[0].items()}
        | {"function": {k: v for k, v in TOOLS[0]["function"].items() if k != "strict"}},
        ensure_ascii=False,
    )
    + "\n</tools>\n\nFor each function call, output the function name and arguments within the following "
    "XML format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}"
    "</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>"
)
CALLS = [
    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
    {
        "id": "c2",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Rome", "days": 3}},
    },
]


def expected_ids(tokenizer: Any, pieces: list[str]) -> list[int]:
    """Token ids of the reference layout: control tokens by id, the text between them tokenised alone."""
    ids: list[int] = []
    text = ""
    for piece in pieces:
        if piece in SPECIAL_TOKENS:
            if text:
                ids += tokenizer.encode(text, add_special_tokens=False)
                text = ""
            ids.append(tokenizer.convert_tokens_to_ids(piece))
        else:
            text += piece
    if text:
        ids += tokenizer.encode(text, add_special_tokens=False)
    return ids


def opening(effort: str | None) -> list[str]:
    """The pieces every prompt starts with; with thinking on, the system turn that names the effort."""
    return ["[gMASK]", "<sop>", *(["<|system|>", f"Reasoning Effort: {effort}"] if effort else [])]


SAY_HI = {"messages": [{"role": "user", "content": "hi"}]}
HI_TURN = ["<|user|>", "hi", "<|assistant|>", "<think>"]

SUMS = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "add them"},
    {"role": "user", "content": "and 3+3?"},
]


def sums_pieces(kept_reasoning: list[str]) -> list[str]:
    """SUMS as rendered: the earlier turn's reasoning is either cleared or kept."""
    return [
        *opening("Max"),
        *["<|user|>", "2+2?", "<|assistant|>", "<think>", *kept_reasoning, "</think>", "4"],
        *["<|user|>", "and 3+3?", "<|assistant|>", "<think>"],
    ]


def call_pieces(name: str, arguments: dict[str, str]) -> list[str]:
    """One tool call as rendered: the name, then each argument as a key/value pair."""
    pieces = ["<tool_call>", name]
    for key, value in arguments.items():
        pieces += ["<arg_key>", key, "</arg_key>", "<arg_value>", value, "</arg_value>"]
    return [*pieces, "</tool_call>"]


GOLDEN: dict[str, tuple[dict[str, Any], list[str]]] = {
    "plain chat": (SAY_HI, [*opening("Max"), *HI_TURN]),
    "system prompt": (
        {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]},
        [*opening("Max"), "<|system|>", "You are terse.", *HI_TURN],
    ),
    "effort low": ({**SAY_HI, "effort": "low"}, [*opening("Low"), *HI_TURN]),
    "effort high": ({**SAY_HI, "effort": "high"}, [*opening("High"), *HI_TURN]),
    "effort medium is high": ({**SAY_HI, "effort": "medium"}, [*opening("High"), *HI_TURN]),
    "effort max": ({**SAY_HI, "effort": "max"}, [*opening("Max"), *HI_TURN]),
    "effort xhigh is max": ({**SAY_HI, "effort": "xhigh"}, [*opening("Max"), *HI_TURN]),
    "thinking off": (
        {**SAY_HI, "kwargs": {"enable_thinking": False}},
        [*opening(None), *HI_TURN, "</think>"],
    ),
    "effort none is thinking off": ({**SAY_HI, "effort": "none"}, [*opening(None), *HI_TURN, "</think>"]),
    "multi-turn, earlier reasoning cleared": ({"messages": SUMS}, sums_pieces(kept_reasoning=[])),
    "multi-turn, earlier reasoning kept": (
        {"messages": SUMS, "kwargs": {"clear_thinking": False}},
        sums_pieces(kept_reasoning=["add them"]),
    ),
    "tools offered": (
        {"messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS, "effort": "high"},
        [
            *opening("High"),
            TOOLS_BLOCK,
            "<|user|>",
            "weather?",
            "<|assistant|>",
            "<think>",
        ],
    ),
    "tool results": (
        {
            "messages": [
                {"role": "user", "content": "Paris and Rome?"},
                {
                    "role": "assistant",
                    "content": None,
                    "reasoning_content": "ask the tool",
                    "tool_calls": CALLS,
                },
                {"role": "tool", "tool_call_id": "c2", "content": "sunny"},
                {"role": "tool", "tool_call_id": "c1", "content": "rain"},
            ],
            "tools": TOOLS,
            "effort": "low",
        },
        [
            *opening("Low"),
            TOOLS_BLOCK,
            "<|user|>",
            "Paris and Rome?",
            "<|assistant|>",
            "<think>",
            "ask the tool",
            "</think>",
            *call_pieces("get_weather", {"city": "Paris"}),
            *call_pieces("get_weather", {"city": "Rome", "days": "3"}),
            "<|observation|>",
            "<tool_response>",
            "rain",
            "</tool_response>",
            "<tool_response>",
            "sunny",
            "</tool_response>",
            "<|assistant|>",
            "<think>",
        ],
    ),
    "images": (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "compare "},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}},
                    ],
                }
            ],
            "effort": "high",
        },
        [
            *opening("High"),
            "<|user|>",
            "compare ",
            "<|begin_of_image|>",
            "<|image|>",
            "<|end_of_image|>",
            "<|begin_of_image|>",
            "<|image|>",
            "<|end_of_image|>",
            "<|begin_of_video|>",
            "<|video|>",
            "<|end_of_video|>",
            "<|assistant|>",
            "<think>",
        ],
    ),
}


def _render(renderer: PromptRenderer, case: dict[str, Any]) -> str:
    options = prompt_options(case.get("effort"), case.get("kwargs"))
    return renderer.render(case["messages"], case.get("tools"), options)


@pytest.mark.parametrize("name", list(GOLDEN))
def test_golden_prompt_matches_reference_token_for_token(name: str, tokenizer: Any) -> None:
    case, pieces = GOLDEN[name]
    text = _render(PromptRenderer(), case)
    assert text == "".join(pieces)
    assert tokenizer.encode(text, add_special_tokens=False) == expected_ids(tokenizer, pieces)


@pytest.mark.parametrize("name", list(GOLDEN))
def test_checkpoint_template_renders_the_same(name: str, tiny_glm: Path) -> None:
    case, pieces = GOLDEN[name]
    assert _render(PromptRenderer.for_checkpoint(tiny_glm), case) == "".join(pieces)


def test_control_tokens_carry_the_reference_ids(tokenizer: Any) -> None:
    text = _render(PromptRenderer(), GOLDEN["tool results"][0]) + _render(
        PromptRenderer(), GOLDEN["images"][0]
    )
    for token_id in tokenizer.encode(text, add_special_tokens=False):
        token = tokenizer.convert_ids_to_tokens(token_id)
        if token in REFERENCE_IDS:
            assert token_id - SPECIAL_BASE + PUBLISHED_BASE_ID == REFERENCE_IDS[token]


def test_effort_line_sits_at_token_three(tokenizer: Any) -> None:
    ids = tokenizer.encode(_render(PromptRenderer(), GOLDEN["effort high"][0]), add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(ids[:3]) == ["[gMASK]", "<sop>", "<|system|>"]
    assert tokenizer.decode(ids[3:]).startswith("Reasoning Effort: High")


def test_pitfalls_are_normalised_before_rendering() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "reasoning": "vllm spelling",
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": "ping", "arguments": ""}}],
        },
        {"role": "tool", "tool_call_id": "x", "content": "pong"},
    ]
    text = PromptRenderer().render(messages, [{"type": "function", "function": {"name": "ping"}}])
    assert "None" not in text
    assert "<think>vllm spelling</think><tool_call>ping</tool_call><|observation|>" in text


def test_reasoning_inside_content_is_split_out() -> None:
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>why</think>because"},
    ]
    text = PromptRenderer().render(messages, options=prompt_options(None, {"clear_thinking": False}))
    assert text.endswith("<|assistant|><think>why</think>because<|assistant|><think>")


def test_deferred_tools_are_not_listed() -> None:
    tools = [*TOOLS, {"type": "function", "function": {"name": "later", "defer_loading": True}}]
    text = PromptRenderer().render([{"role": "user", "content": "x"}], tools)
    assert "get_weather" in text and "later" not in text and "strict" not in text


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "wizard", "content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": [{"type": "audio"}]}], "messages[0].content[0].type"),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{nope"}}]}],
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}],
            "messages[0].tool_calls[0].function.arguments",
        ),
    ],
)
def test_bad_messages_name_the_field(messages: list[dict[str, Any]], param: str) -> None:
    with pytest.raises(RenderError) as error:
        PromptRenderer().render(messages)
    assert error.value.param == param


def test_foreign_template_runs_sandboxed_and_gets_thinking_off(tmp_path: Path) -> None:
    (tmp_path / "chat_template.jinja").write_text(
        "[gMASK]<sop><|system|>Reasoning Effort: Max{% for m in messages %}<|{{ m.role }}|>{{ m.content }}"
        "{% endfor %}<|assistant|><think>"
    )
    renderer = PromptRenderer.for_checkpoint(tmp_path)
    text = renderer.render([{"role": "user", "content": "hi"}], options=prompt_options("none"))
    assert text == "[gMASK]<sop><|user|>hi<|assistant|><think></think>"
    evil = PromptRenderer("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(RenderError):
        evil.render([{"role": "user", "content": "hi"}])


def test_template_raise_exception_is_a_render_error() -> None:
    renderer = PromptRenderer("{{ raise_exception('no system role') }}")
    with pytest.raises(RenderError, match="no system role"):
        renderer.render([{"role": "user", "content": "hi"}])


def test_render_request_offers_no_tools_for_tool_choice_none() -> None:
    from sparkfold.protocol import ChatCompletionRequest

    request = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS, "tool_choice": "none"}
    )
    rendered = PromptRenderer().render_request(request, default_thinking=False)
    assert rendered.tools == [] and "<tools>" not in rendered.text
    assert rendered.text.endswith("<think></think>") and not rendered.options.thinking
    assert not rendered.thinking and PromptRenderer().render_request(request).thinking
