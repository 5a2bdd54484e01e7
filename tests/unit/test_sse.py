"""SSE encoding (``sparkfold.sse``) of the engine protocol's models (``sparkfold.protocol``)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkfold.protocol import (
    ChatCompletionChunk,
    ChunkChoice,
    Completion,
    CompletionChoice,
    Delta,
)
from sparkfold.sse import TextEvents, sse_event


def _payload(event: bytes) -> object:
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    return json.loads(event[6:])


@given(st.text())
def test_a_text_event_is_the_models_own_event_with_that_text(text: str) -> None:
    def completion(value: str) -> Completion:
        return Completion(id="cmpl-1", model="glm", created=7, choices=[CompletionChoice(text=value)])

    def chat(value: str) -> ChatCompletionChunk:
        delta = Delta(reasoning_content=value)
        return ChatCompletionChunk(id="chat-1", model="glm", created=7, choices=[ChunkChoice(delta=delta)])

    for make in (completion, chat):
        assert _payload(TextEvents(make(TextEvents.MARKER))(text)) == _payload(sse_event(make(text)))


def test_a_model_without_the_marker_is_refused() -> None:
    with pytest.raises(ValueError, match="exactly once"):
        TextEvents(Completion(id="c", model="glm", choices=[CompletionChoice(text="plain")]))
