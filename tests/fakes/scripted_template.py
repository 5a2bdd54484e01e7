"""A scripted chat-template model: replies with a fixed text through a real Hugging Face tokenizer.

The demo model's path with its weights left out: the checkpoint's tokenizer and chat template,
:mod:`sparkfold.engines.template_tools` rendering and parsing (and, for forced calls, the grammar
compiled for that tokenizer, which the scripted reply already follows), the engine server and, in
integration tests, the gateway. The reply is ``script`` tokenised, up to its first stop token.
"""

from __future__ import annotations

from pathlib import Path

from tests.fakes.fake_engine import FakeGenerator

from sparkfold.engines.threaded import HfTokenizer

__all__ = ["ScriptedTemplate"]


class ScriptedTemplate(HfTokenizer, FakeGenerator):
    """Replies with ``script`` tokenised by the tokenizer in ``model_dir``; stops at its stop token."""

    backend = "scripted-template"

    def __init__(self, model_dir: Path, script: str) -> None:
        from transformers import AutoTokenizer

        super().__init__(context_length=4096, parallel=2)
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self._adopt(tokenizer)
        self.vocab_size = len(tokenizer)
        self.eos_token_ids = frozenset({int(tokenizer.eos_token_id)})
        self.script = script

    def reply_ids(self) -> list[int]:
        ids = self.encode(self.script)
        ends = [n for n, token in enumerate(ids) if token in self.eos_token_ids]
        return ids[: ends[0] + 1] if ends else [*ids, min(self.eos_token_ids)]
