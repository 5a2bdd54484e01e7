"""A scripted GLM "model": replies with a fixed text through the tiny GLM tokenizer.

Tests use it where the reply must be exactly a given GLM output (reasoning, a tool call, stop
tokens) while everything else is real: the tokenizer, ``sparkfold.glm`` rendering and parsing,
the engine server, and (in integration tests) the gateway in front of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.fakes.fake_engine import FakeGenerator

from sparkfold.glm.chat import GlmChat

__all__ = ["ASK", "CALL", "TOOLS", "ScriptedGlm"]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
]
CALL = (
    "Let me check the weather.</think>Sure.<tool_call>get_weather<arg_key>city</arg_key>"
    "<arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>2</arg_value></tool_call><|observation|>"
)
ASK = [{"role": "user", "content": "Weather in Paris?"}]


class ScriptedGlm(FakeGenerator):
    """Replies with ``script`` tokenised by the tiny GLM tokenizer; stops at a GLM stop token."""

    backend = "scripted-glm"
    chat_template = None
    vocab_size = 1024

    def __init__(self, model_dir: Path, script: str) -> None:
        from transformers import AutoImageProcessor, AutoTokenizer

        super().__init__(context_length=4096, parallel=2)
        self._tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.glm = GlmChat(
            self._tokenizer,
            model_dir=model_dir,
            vocab_size=self.vocab_size,
            image_processor=AutoImageProcessor.from_pretrained(str(model_dir)),
            has_vision=True,
        )
        self.eos_token_ids = self.glm.stop_token_ids
        self.special_tokens = {}
        self.script = script

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def token_strs(self, ids: Sequence[int]) -> list[str]:
        return list(self.tokenizer.convert_ids_to_tokens(list(ids)))

    def reply_ids(self) -> list[int]:
        ids = self.encode(self.script)
        ends = [n for n, token in enumerate(ids) if token in self.eos_token_ids]
        return ids[: ends[0] + 1] if ends else ids
