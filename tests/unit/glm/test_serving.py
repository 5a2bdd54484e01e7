"""The GLM layer in the shapes an engine server takes: prepared turns and the streaming parser."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from sparkfold.glm.chat import GlmChat, StreamParser, forced_call_cap, is_glm_model
from sparkfold.glm.errors import GrammarError, MediaError
from sparkfold.protocol import ChatCompletionRequest

TOOLS = [
    {"type": "function", "function": {"name": "f", "parameters": {"properties": {"n": {"type": "integer"}}}}}
]


def request(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


def picture() -> dict[str, Any]:
    buffer = io.BytesIO()
    Image.new("RGB", (56, 56), (0, 0, 255)).save(buffer, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}


@pytest.fixture(scope="module")
def chat(tiny_glm: Path, tokenizer: Any) -> GlmChat:
    from transformers import AutoImageProcessor

    return GlmChat(
        tokenizer,
        model_dir=tiny_glm,
        vocab_size=1024,
        image_processor=AutoImageProcessor.from_pretrained(str(tiny_glm)),
        has_vision=True,
    )


def test_stream_parser_speaks_the_engine_seam() -> None:
    parser = StreamParser(TOOLS, thinking=True)
    assert parser.feed("why</think>ok")[0].model_dump(exclude_none=True) == {
        "reasoning_content": "why",
        "content": "ok",
    }
    (named,) = parser.feed("<tool_call>f<arg_key>n</arg_key>")  # announced at its first argument tag
    assert named.tool_calls and named.tool_calls[0].function == {"name": "f", "arguments": ""}
    assert parser.feed("<arg_value>") == [] and not parser.tool_calls_made  # no empty deltas
    assert parser.finish("length") == [] and parser.tool_calls_made  # the cut call is the reply's
    closed = StreamParser(TOOLS, thinking=False)
    pieces = closed.feed("<tool_call>f<arg_key>n</arg_key><arg_value>2</arg_value>")
    (delta,) = closed.finish("stop")  # an end-of-sequence token closed it
    calls = [c for d in [*pieces, delta] for c in d.tool_calls or []]
    assert closed.tool_calls_made and calls[0].function and calls[0].function["name"] == "f"
    assert "".join((c.function or {})["arguments"] for c in calls) == '{"n": 2}'


def test_forced_parallel_calls_are_capped_by_the_offered_tools() -> None:
    assert forced_call_cap(request(tools=TOOLS, tool_choice="required"), 3) == 3
    assert forced_call_cap(request(tools=TOOLS * 2, tool_choice="required"), 3) == 6
    named = {"type": "function", "function": {"name": "f"}}
    assert forced_call_cap(request(tools=TOOLS * 2, tool_choice=named), 3) is None  # one call by grammar
    assert forced_call_cap(request(tools=TOOLS, tool_choice="required", parallel_tool_calls=False), 3) is None
    assert forced_call_cap(request(tools=TOOLS, tool_choice="auto"), 3) is None
    parser = StreamParser(TOOLS, thinking=False, max_calls=2)
    for n in range(3):
        parser.feed(f"<tool_call>f<arg_key>n</arg_key><arg_value>{n}</arg_value></tool_call>")
    assert parser.ended and parser.tool_calls_made


def test_prepare_renders_sees_and_constrains(chat: GlmChat) -> None:
    turn = chat.prepare(
        request(
            messages=[picture()], guided_choice=["a", "b"], chat_template_kwargs={"enable_thinking": False}
        )
    )
    assert turn.prompt.count("<|image|>") == 16 and turn.vision["image_grid_thw"].tolist() == [[1, 8, 8]]
    assert turn.matcher is not None and turn.matcher.active  # thinking off: constrained at once
    assert turn.prompt.endswith("<|assistant|><think></think>")
    plain = chat.prepare(request(tools=TOOLS))
    assert plain.matcher is None and plain.vision == {} and "<tools>" in plain.prompt
    assert isinstance(plain.parser(), StreamParser)
    parser = chat.parser_for(request(tools=TOOLS, reasoning_effort="none"))
    assert parser.feed("<tool_call>f<arg_key>n</arg_key><arg_value>1</arg_value></tool_call>")[0].tool_calls
    assert (
        chat.render(request())
        == plain.prompt.split("<|system|>\n# Tools")[0] + "<|user|>hi<|assistant|><think>"
    )
    assert {chat.tokenizer.convert_ids_to_tokens(i) for i in chat.stop_token_ids} == {
        "<|endoftext|>",
        "<|user|>",
        "<|observation|>",
        "<|assistant|>",
    }


def test_prepare_refuses_what_it_cannot_serve(chat: GlmChat, tokenizer: Any) -> None:
    with pytest.raises(GrammarError) as error:
        chat.prepare(request(guided_regex="(unclosed"))
    assert error.value.param == "guided_regex"
    blind = GlmChat(tokenizer, has_vision=False, model_name="SmolLM2")
    with pytest.raises(MediaError, match="SmolLM2 has no vision tower"):
        blind.prepare(request(messages=[picture()]))
    video = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AA"}}
    clip = {"role": "user", "content": [video]}
    with pytest.raises(MediaError, match="cannot read video") as refused:  # before any decoding
        chat.prepare(request(messages=[clip]))
    assert refused.value.param == "messages[0].content[0]"


def test_glm_models_are_recognised() -> None:
    assert is_glm_model({"model_type": "glm5_next"}) and not is_glm_model({"model_type": "llama"})
