"""What an engine server needs from the GLM layer, in the shapes of its seam.

:class:`GlmChat` is built once per loaded GLM model; :meth:`GlmChat.prepare` turns one chat
request into a :class:`GlmTurn`: the prompt text (pictures expanded by the model's processors),
the vision tensors, the structured-output matcher and the parser for the reply. Every client
mistake raises a :class:`~sparkfold.glm.errors.GlmError` (HTTP 400, ``param`` names the field).

:class:`StreamParser` is the reply parser in the engine's ``OutputParser`` shape: ``feed(text)``
and ``finish(finish_reason)`` return wire :class:`~sparkfold.protocol.Delta` lists (none for text
that says nothing yet: no empty deltas; a tool call streams as ``tool_calls`` pieces);
``tool_calls_made`` says whether the finish reason becomes ``tool_calls``; ``ended`` that the
reply is over before the engine saw it end (a repeated call, the forced-call cap).

Forced calls (``tool_choice`` ``"required"`` or a named function, parallel calls allowed) are a
grammar of "one or more calls" (:mod:`sparkfold.glm.grammar`), which GLM-5.3 fills by repeating
calls until ``max_tokens``; the parser bounds them: an identical call ends the reply, and so does
the ``forced_calls_per_tool`` × offered tools-th call (``[engine] forced_calls_per_tool``); the
grammar itself allows nothing but calls once they are forced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkfold.config import FORCED_CALLS_PER_TOOL
from sparkfold.glm.errors import MediaError
from sparkfold.glm.media import DecodeLimits, collect_media, load_media, require_vision, vision_inputs
from sparkfold.glm.parser import GlmParser
from sparkfold.glm.render import PromptRenderer, RenderedPrompt
from sparkfold.glm.tokens import STOP_TOKENS, THINK_END
from sparkfold.protocol import Delta

if TYPE_CHECKING:
    from sparkfold.config import EngineSettings

__all__ = ["GlmChat", "GlmTurn", "StreamParser", "forced_call_cap", "is_glm_model"]

GLM_MODEL_TYPES = frozenset({"glm5_next", "glm5_next_text", "glm_moe_dsa"})


def is_glm_model(config: Any) -> bool:
    """Whether a transformers config (or ``config.json`` dict) is a GLM-5.x model."""
    if isinstance(config, Mapping):
        return config.get("model_type") in GLM_MODEL_TYPES
    return getattr(config, "model_type", None) in GLM_MODEL_TYPES


def forced_call_cap(request: Any, per_tool: int) -> int | None:
    """At most this many calls in a reply whose calls are forced (``tool_choice: "required"``)
    with parallel calls allowed; a named ``tool_choice`` is one call already (its grammar)."""
    tools = getattr(request, "tools", None) or []
    if not tools or getattr(request, "tool_choice", None) != "required":
        return None
    return None if getattr(request, "parallel_tool_calls", None) is False else per_tool * len(tools)


class StreamParser:
    """The GLM reply parser behind an engine's ``OutputParser`` seam."""

    def __init__(
        self, tools: Sequence[Mapping[str, Any]] | None, *, thinking: bool, max_calls: int | None = None
    ) -> None:
        self._parser = GlmParser(tools, thinking=thinking, max_calls=max_calls)

    @property
    def rejected(self) -> list[str]:
        """Raw text of calls that were not returned (unoffered tool, unreadable)."""
        return self._parser.rejected

    @property
    def tool_calls_made(self) -> bool:
        return bool(self._parser.tool_calls)

    @property
    def ended(self) -> bool:
        """The reply is over: what the model writes next would be dropped, so the engine stops."""
        return self._parser.finished

    def feed(self, text: str) -> list[Delta]:
        delta = self._parser.feed(text)
        return [] if delta.empty else [delta.to_delta()]

    def finish(self, finish_reason: str | None = None) -> list[Delta]:
        """End of reply; ``finish_reason == "length"`` ends an open call where it was cut."""
        delta = self._parser.finish(truncated=finish_reason == "length")
        return [] if delta.empty else [delta.to_delta()]


@dataclass
class GlmTurn:
    """One prepared chat request."""

    prompt: str
    rendered: RenderedPrompt
    vision: dict[str, Any] = field(default_factory=dict)
    matcher: Any = None  # ConstrainedMatcher | None
    max_calls: int | None = None

    def parser(self) -> StreamParser:
        return StreamParser(self.rendered.tools, thinking=self.rendered.thinking, max_calls=self.max_calls)


class GlmChat:
    """The GLM protocol for one loaded model: render, constrain, see, parse."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        model_dir: str | Path | None = None,
        vocab_size: int | None = None,
        image_processor: Any = None,
        video_processor: Any = None,
        has_vision: bool = False,
        limits: DecodeLimits | None = None,
        default_thinking: bool = True,
        model_name: str = "this model",
        forced_calls_per_tool: int = FORCED_CALLS_PER_TOOL,
    ) -> None:
        self.tokenizer = tokenizer
        self.renderer = PromptRenderer.for_checkpoint(model_dir) if model_dir else PromptRenderer()
        self.vocab_size = vocab_size
        self.image_processor = image_processor
        self.video_processor = video_processor
        self.has_vision = has_vision
        self.limits = limits or DecodeLimits()
        self.default_thinking = default_thinking
        self.model_name = model_name
        self.forced_calls_per_tool = forced_calls_per_tool

    @classmethod
    def for_engine(cls, settings: EngineSettings, tokenizer: Any, **checkpoint: Any) -> GlmChat:
        """The GLM protocol as an engine's settings ask for it (``[engine.media]``'s limits,
        ``thinking``, ``served_name``, ``forced_calls_per_tool``); ``checkpoint``: what the loaded
        model brings (``model_dir``, ``vocab_size``, the processors, ``has_vision``)."""
        return cls(
            tokenizer,
            limits=DecodeLimits.from_settings(settings.media),
            default_thinking=settings.thinking,
            model_name=settings.served_name,
            forced_calls_per_tool=settings.forced_calls_per_tool,
            **checkpoint,
        )

    @cached_property
    def grammar(self) -> Any:
        from sparkfold.glm.grammar import GrammarCompiler

        return GrammarCompiler(self.tokenizer, vocab_size=self.vocab_size)

    @cached_property
    def stop_token_ids(self) -> frozenset[int]:
        """Ids that end a reply (``<|assistant|>`` included): the engine must stop on all of them."""
        vocab = self.tokenizer.get_vocab()
        return frozenset(vocab[t] for t in STOP_TOKENS if t in vocab)

    @cached_property
    def think_end_id(self) -> int | None:
        """The ``</think>`` token: a thinking reply's reasoning ends there."""
        return self.tokenizer.get_vocab().get(THINK_END)

    def parser_for(self, request: Any) -> StreamParser:
        """The reply parser of ``request`` (the engine's ``ParserFactory`` seam)."""
        rendered = self.renderer.render_request(request, default_thinking=self.default_thinking)
        cap = forced_call_cap(request, self.forced_calls_per_tool)
        return StreamParser(rendered.tools, thinking=rendered.thinking, max_calls=cap)

    def render(self, request: Any) -> str:
        """The prompt text alone (the engine's ``ChatRenderer`` seam; ``/tokenize``)."""
        return self.renderer.render_request(request, default_thinking=self.default_thinking).text

    def prepare(self, request: Any) -> GlmTurn:
        """Render, load pictures, compile the constraint. Raises :class:`GlmError` (400)."""
        from sparkfold.glm.grammar import constraint_from_request

        rendered = self.renderer.render_request(request, default_thinking=self.default_thinking)
        turn = GlmTurn(
            prompt=rendered.text,
            rendered=rendered,
            max_calls=forced_call_cap(request, self.forced_calls_per_tool),
        )
        parts = collect_media(request.messages)
        require_vision(parts, has_vision=self.has_vision, model=self.model_name)
        if parts:
            if self.image_processor is None:
                raise MediaError(f"{self.model_name} has no image processor", param=parts[0].param)
            video = next((p for p in parts if p.kind == "video"), None)
            if video is not None and self.video_processor is None:  # refuse before decoding anything
                raise MediaError(
                    f"this engine cannot read video for {self.model_name}; remove the video_url parts",
                    param=video.param,
                )
            media = load_media(parts, self.limits)
            turn.prompt, turn.vision = vision_inputs(
                rendered.text,
                media,
                image_processor=self.image_processor,
                video_processor=self.video_processor,
                limits=self.limits,
            )
        constraint = constraint_from_request(request, "glm_4_7")
        if constraint is not None:
            turn.matcher = self.grammar.matcher(constraint, thinking=rendered.thinking)
        budget = getattr(request, "thinking_budget", None)
        if budget is not None and rendered.thinking:  # thinking off: nothing to budget
            from sparkfold.glm.budget import ThinkingBudget

            think_end = self.tokenizer.convert_tokens_to_ids(THINK_END)
            vocab = self.vocab_size or len(self.tokenizer)
            turn.matcher = ThinkingBudget(budget, int(think_end), vocab, inner=turn.matcher)
        return turn
