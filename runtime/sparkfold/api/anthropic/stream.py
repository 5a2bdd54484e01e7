"""Chat events as Anthropic Messages stream events.

``message_start``; for each run of reasoning, text or a tool call a ``content_block_start``,
its deltas (``thinking_delta`` (none when the request asked ``thinking.display: "omitted"``) and
the block's ``signature_delta`` before it stops, ``text_delta``, ``input_json_delta``) and
``content_block_stop``;
``message_delta`` with the stop reason and usage; ``message_stop``. Silence becomes ``ping``; an
engine error after the stream opened becomes an ``error`` event, which ends the stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any

from sparkfold.api.anthropic.translate import anthropic_usage, stop_of
from sparkfold.api.chat_stream import DONE, ChatEvent, as_chunk, choices_of, each_event, is_text
from sparkfold.api.sealed import ReasoningSeal
from sparkfold.protocol import new_id
from sparkfold.sse import named_event as event

__all__ = ["anthropic_sse"]


PING = event("ping", {"type": "ping"})


class _Blocks:
    """The open content block and the index of the next one."""

    def __init__(self, seal: ReasoningSeal) -> None:
        self.index = -1
        self.kind: str | None = None
        self.input_sent = False
        self.seal = seal
        self.thinking = ""  # the open thinking block's text: its signature seals it

    def switch(self, kind: str, start: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.kind = kind
        self.input_sent = False
        self.thinking = ""
        out.append(
            event(
                "content_block_start",
                {"type": "content_block_start", "index": self.index, "content_block": start},
            )
        )
        return out

    def close(self) -> list[bytes]:
        if self.kind is None:
            return []
        out = []
        if self.kind == "tool_use" and not self.input_sent:  # a call without arguments: input {}
            out.append(self.delta({"type": "input_json_delta", "partial_json": "{}"}))
        if self.kind == "thinking":
            out.append(self.delta({"type": "signature_delta", "signature": self.seal.seal(self.thinking)}))
        self.kind = None
        out.append(event("content_block_stop", {"type": "content_block_stop", "index": self.index}))
        return out

    def delta(self, body: dict[str, Any]) -> bytes:
        return event(
            "content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": body}
        )


def _message_start(model: str, opening: dict[str, Any]) -> bytes:
    """``message_start``, its usage from the engine's first usage block (the prompt's tokens, the
    cached ones) in Anthropic's shape; nothing is generated yet."""
    return event(
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": new_id("msg", "_"),
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {**anthropic_usage(opening), "output_tokens": 0},
            },
        },
    )


async def anthropic_sse(
    batches: AsyncIterable[list[ChatEvent]],
    *,
    model: str,
    stop_sequences: list[str] | None,
    count_input: Callable[[], Awaitable[int | None]] | None = None,
    seal: ReasoningSeal | None = None,
    omit_thinking: bool = False,
) -> AsyncIterator[bytes]:
    """The Anthropic stream of a chat stream. ``message_start`` carries the prompt's tokens from the
    engine's first chunk (our engines put them there); an engine that does not (TensorFold) has them
    counted by ``count_input`` (its ``/tokenize``), else 0. ``seal`` signs each thinking block's
    text; ``omit_thinking`` sends the blocks without it (``thinking.display: "omitted"``)."""
    blocks = _Blocks(seal or ReasoningSeal())
    finish: dict[str, Any] = {}
    usage: dict[str, Any] = {}
    started = False
    async for item in each_event(batches):
        if not started:  # after the engine's first chunk: it carries the prompt's token count
            started = True
            opening = getattr(batches, "usage", None)
            opening = dict(opening) if isinstance(opening, dict) else {}
            if not isinstance(opening.get("prompt_tokens"), int) and count_input is not None:
                opening["prompt_tokens"] = await count_input()
            yield _message_start(model, opening)
        if item is None:
            yield PING
            continue
        if item is DONE:
            break
        chunk = as_chunk(item)  # type: ignore[arg-type]
        if "error" in chunk:
            for out in blocks.close():
                yield out
            info = chunk["error"] if isinstance(chunk["error"], dict) else {}
            message = str(info.get("message") or chunk["error"])
            yield event("error", {"type": "error", "error": {"type": "api_error", "message": message}})
            return
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        for choice, delta in choices_of(chunk):
            if is_text(delta.get("reasoning_content")):
                if blocks.kind != "thinking":
                    for out in blocks.switch(
                        "thinking", {"type": "thinking", "thinking": "", "signature": ""}
                    ):
                        yield out
                blocks.thinking += delta["reasoning_content"]
                if not omit_thinking:
                    yield blocks.delta({"type": "thinking_delta", "thinking": delta["reasoning_content"]})
            if is_text(delta.get("content")):
                if blocks.kind != "text":
                    for out in blocks.switch("text", {"type": "text", "text": ""}):
                        yield out
                yield blocks.delta({"type": "text_delta", "text": delta["content"]})
            for call in delta.get("tool_calls") or []:  # a call's first delta names it; the rest add input
                function = call.get("function") or {}
                if function.get("name"):
                    start = {
                        "type": "tool_use",
                        "id": call.get("id") or new_id("toolu", "_"),
                        "name": function["name"],
                        "input": {},
                    }
                    for out in blocks.switch("tool_use", start):
                        yield out
                piece = function.get("arguments") or ""
                if blocks.kind == "tool_use" and piece:
                    blocks.input_sent = True
                    yield blocks.delta({"type": "input_json_delta", "partial_json": piece})
            if choice.get("finish_reason"):
                finish = choice
    if not started:
        yield _message_start(model, {})
    for out in blocks.close():
        yield out
    stop_reason, stop_sequence = stop_of(finish, stop_sequences)
    yield event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": anthropic_usage(usage),
        },
    )
    yield event("message_stop", {"type": "message_stop"})
