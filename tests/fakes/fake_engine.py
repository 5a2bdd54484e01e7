"""An in-process fake engine: bytes are tokens, so server tests need no model.

:class:`FakeGenerator` also keeps the books every in-process fake needs (requests seen, their cancel
events, a failure or a pace on demand); a fake with another reply overrides :meth:`reply_ids` and
the tokenizer methods (see ``scripted_glm.py``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence

from sparkfold.engines.generator import Generator, SamplingParams

EOS = 256
TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


class FakeGenerator(Generator):
    """Token id = byte value; the reply is ``reply`` (bytes) then EOS; ``fail_after`` raises mid-reply."""

    backend = "fake"
    chat_template: str | None = TEMPLATE
    eos_token_ids = frozenset({EOS})
    vocab_size = 257

    def __init__(self, reply: str = "Paris is the capital.", *, context_length: int = 256, parallel: int = 2):
        self.reply = reply.encode()
        self.special_tokens = {"eos_token": "</s>"}
        self.context_length = context_length
        self.parallel = parallel
        self.fail_after: int | None = None
        self.failure: BaseException = RuntimeError("the fake engine broke")
        """What ``fail_after`` raises."""
        self.delay_s = 0.0
        self.seen: list[tuple[list[int], SamplingParams]] = []
        self.cancelled: list[threading.Event] = []

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode())

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode(errors="replace")

    def token_strs(self, ids: Sequence[int]) -> list[str]:
        return [chr(i) if i < 256 else "</s>" for i in ids]

    def healthy(self) -> bool:
        return True

    def close(self) -> None:
        pass

    def reply_ids(self) -> list[int]:
        """The whole reply, stop token included; ``generate`` cuts it at ``max_tokens``."""
        return [*self.reply, EOS]

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, cancel: threading.Event
    ) -> AsyncIterator[int]:
        self.seen.append((list(prompt_ids), params))
        self.cancelled.append(cancel)
        for n, token in enumerate(self.reply_ids()[: params.max_tokens]):
            if cancel.is_set():
                return
            if self.fail_after is not None and n >= self.fail_after:
                raise self.failure
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            yield token
