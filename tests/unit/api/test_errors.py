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
