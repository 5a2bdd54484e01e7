"""GLM-5.3 protocol for our own engines: prompts, thinking, tool calls, structured outputs, pictures.

Engine-agnostic (imports nothing from ``engines/``, ``api/`` or ``node/``):

``render``      messages + tools → prompt text (the checkpoint's template or ours, sandboxed)
``messages``    normalising what clients send before a template sees it
``parser``      generated text → reasoning_content / content / tool calls, streaming or not
``calls``       one tool call → OpenAI ``tool_calls`` pieces as it is generated
``arguments``   tool-call argument values typed by the offered JSON schema
``grammar``     response_format / guided_* → xgrammar matcher (imports torch and xgrammar)
``logits``      that matcher as a transformers LogitsProcessor (imports transformers)
``media``       image_url / video_url parts → decoded frames → the model's processor
``serving``     all of it per request, in the shapes an engine server's seam takes
``tokens``      the GLM control tokens and their ids
``errors``      :class:`GlmError` and its 400-class subclasses

The light modules are re-exported here; ``grammar`` and ``logits`` are imported where used.
"""

from __future__ import annotations

from sparkfold.glm.errors import GlmError, GrammarError, MediaError, RenderError
from sparkfold.glm.media import DecodeLimits, collect_media, load_media, require_vision, vision_inputs
from sparkfold.glm.parser import GlmParser, ParsedDelta, ParsedMessage, ParsedToolCall, parse_output
from sparkfold.glm.render import PromptOptions, PromptRenderer, RenderedPrompt, offered_tools, prompt_options

__all__ = [
    "DecodeLimits",
    "GlmError",
    "GlmParser",
    "GrammarError",
    "MediaError",
    "ParsedDelta",
    "ParsedMessage",
    "ParsedToolCall",
    "PromptOptions",
    "PromptRenderer",
    "RenderError",
    "RenderedPrompt",
    "collect_media",
    "load_media",
    "offered_tools",
    "parse_output",
    "prompt_options",
    "require_vision",
    "vision_inputs",
]
