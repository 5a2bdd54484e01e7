"""The gateway's error values: what a client is told, and where."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sparkfold.api.errors import untranslatable
from sparkfold.protocol import ChatCompletionRequest


def test_an_untranslatable_request_names_the_refused_field() -> None:
    with pytest.raises(ValidationError) as refused:
        ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "n": "many"})
    error = untranslatable(refused.value)
    assert error.status == 400 and error.param == "n"
    assert str(error).startswith("cannot translate the request: n: ")


def test_a_refused_content_is_named_by_its_field_not_by_the_unions_members() -> None:
    """pydantic puts each union member's name in ``loc`` (``…content.function-after[_typed_parts(), …]``);
    the 400 names the field the client sent."""
    parts = [{"type": 1}]
    with pytest.raises(ValidationError) as refused:
        ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": parts}]})
    error = untranslatable(refused.value)
    assert error.param == "messages.0.content", error.param
    assert str(error).startswith("cannot translate the request: messages.0.content: "), str(error)
