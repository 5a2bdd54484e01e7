"""A scripted GLM "model": replies with a fixed text through the tiny GLM tokenizer.

Tests use it where the reply must be exactly a given GLM output (reasoning, a tool call, stop
tokens) while everything else is real: the tokenizer, ``sparkfold.glm`` rendering and parsing,
the engine server, and (in integration tests) the gateway in front of it.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from sparkfold.engines.generator import SamplingParams
from sparkfold.glm.serving import GlmChat

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


class ScriptedGlm:
    """Replies with ``script`` tokenised by the tiny GLM tokenizer; stops at a GLM stop token."""

    backend = "scripted-glm"
    chat_template = None
    context_length = 4096
    parallel = 2

    def __init__(self, model_dir: Path, script: str) -> None:
        from transformers import AutoImageProcessor, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.glm = GlmChat(
            self.tokenizer,
            model_dir=model_dir,
            vocab_size=1024,
            image_processor=AutoImageProcessor.from_pretrained(str(model_dir)),
            has_vision=True,
        )
        self.eos_token_ids = self.glm.stop_token_ids
        self.special_tokens: dict[str, str] = {}
        self.script = script
        self.seen: list[tuple[list[int], SamplingParams]] = []

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def token_strs(self, ids: Sequence[int]) -> list[str]:
        return list(self.tokenizer.convert_ids_to_tokens(list(ids)))

    def healthy(self) -> bool:
        return True

    def close(self) -> None:
        pass

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, cancel: threading.Event
    ) -> AsyncIterator[int]:
        self.seen.append((list(prompt_ids), params))
        for token in self.encode(self.script)[: params.max_tokens]:
            yield token
            if token in self.eos_token_ids:
                return
