"""A request as the engine will run it: checked against the engine, rendered, tokenized, sampled.

:class:`RequestPreparer` turns a chat or completion request into one :class:`Prepared` reply per
choice (prompt ids, sampling, stop strings, the reply's parser), or the :class:`ErrorReply` that
refuses it: a model the server does not serve, a field the engine cannot honour, a prompt past
the window, token ids outside the vocabulary. A GLM model brings ``glm`` and then prompts,
reasoning, tool calls, structured outputs and pictures follow ``sparkfold.glm``; another model's
chat template renders its prompts. The work is slow (rendering, tokenizing, pictures, grammar):
the server runs it in :class:`~sparkfold.engines.prompt_workers.PromptWorkers`.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from sparkfold.config import FORCED_CALLS_PER_TOOL
from sparkfold.engines.chat_template import ChatRenderer, ChatTemplateRenderer
from sparkfold.engines.error_reply import ErrorReply, unavailable
from sparkfold.engines.generator import EngineGone, Generator, SamplingParams
from sparkfold.engines.output import OutputParser, ParserFactory, PlainParser, plain_parser
from sparkfold.engines.prompt_ids import PromptIds
from sparkfold.glm.errors import GlmError, GrammarError
from sparkfold.glm.media import collect_media, require_vision
from sparkfold.protocol import ChatCompletionRequest, CompletionRequest, ignored_fields, ignored_summary

if TYPE_CHECKING:
    from sparkfold.glm.chat import GlmChat

__all__ = ["Prepared", "RequestPreparer"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """A request the engine accepted: prompt ids, sampling and text options."""

    prompt_ids: list[int]
    params: SamplingParams
    stop: list[str] = field(default_factory=list)
    parser: OutputParser = field(default_factory=PlainParser)
    """Splits the reply text into deltas (chat requests; plain content otherwise)."""
    reasoning_end: int | None = None
    """A thinking reply: the token that closes its reasoning (reply tokens before it are reasoning)."""


class RequestPreparer:
    """Requests to :class:`Prepared` replies for one :class:`Generator`.

    ``renderer`` and ``parser_factory`` default to the checkpoint's chat template and plain
    content; a GLM model brings ``glm`` (the generator's ``glm`` by default).
    """

    def __init__(
        self,
        generator: Generator,
        *,
        served_name: str,
        max_tokens: int,
        seed: int = 0,
        thinking: bool = True,
        renderer: ChatRenderer | None = None,
        parser_factory: ParserFactory | None = None,
        stop_token_ids: frozenset[int] = frozenset(),
        glm: GlmChat | None = None,
        forced_calls_per_tool: int = FORCED_CALLS_PER_TOOL,
    ) -> None:
        self.generator = generator
        self.served_name = served_name
        self.max_tokens = max_tokens
        self.seed = seed
        self.parser_factory = parser_factory or functools.partial(
            plain_parser, per_tool=forced_calls_per_tool
        )
        self.stop_token_ids = stop_token_ids
        self.glm = glm if glm is not None else generator.glm
        if self.glm is not None:  # GLM: prompts, reasoning, tool calls, grammar, pictures
            renderer = renderer or self.glm
            self.parser_factory = self.glm.parser_for
            self.stop_token_ids = stop_token_ids | self.glm.stop_token_ids
        if renderer is None and generator.chat_template:
            renderer = ChatTemplateRenderer(
                generator.chat_template, generator.special_tokens, thinking=thinking
            )
        self.renderer = renderer
        self._grammar: Any = None  # GrammarCompiler of a chat-template model, built at first use
        self.encode = PromptIds(generator.encode)
        """The generator's tokenizer, with the ids of recent long prompts kept (a re-sent prompt)."""

    def _check_common(self, request: ChatCompletionRequest | CompletionRequest) -> ErrorReply | None:
        if request.model and request.model != self.served_name:
            return ErrorReply(
                404,
                f"The model `{request.model}` does not exist; this server serves `{self.served_name}`.",
                "model",
                "model_not_found",
            )
        wants = request.logprobs not in (None, False) or getattr(request, "top_logprobs", None)
        if wants and not self.generator.supports_logprobs:
            return ErrorReply(
                400,
                f"logprobs are not available from the {self.generator.backend} engine; leave logprobs unset",
                "logprobs",
            )
        if getattr(request, "top_logprobs", None) and not request.logprobs:
            return ErrorReply(400, "top_logprobs needs logprobs: true", "top_logprobs")
        for penalty in ("frequency_penalty", "presence_penalty"):  # never silently ignored
            if getattr(request, penalty, None):
                return ErrorReply(
                    400, f"{penalty} is not supported by this engine; leave it unset or 0", penalty
                )
        extra = ignored_fields(request)
        if extra:
            log.info("ignored request fields", extra=ignored_summary(extra))
        return None

    def prepare_chat_choices(self, request: ChatCompletionRequest) -> list[Prepared] | ErrorReply:
        """One prepared reply per choice (``n``), each with its own seed, grammar and parser."""
        started = time.monotonic()
        out = []
        for one in _choices(request, self.seed):
            prepared = self.prepare_chat(one)
            if isinstance(prepared, ErrorReply):
                return prepared
            out.append(prepared)
        return _stamp(out, started)

    def prepare_chat(self, request: ChatCompletionRequest) -> Prepared | ErrorReply:
        error = self._check_common(request)
        if error:
            return error
        if self.glm is not None:
            return self._prepare_glm(request, self.glm)
        if request.thinking_budget is not None:  # no reasoning to budget in a plain chat template
            log.info("ignored request fields", extra=ignored_summary(["thinking_budget"]))
        try:  # a model without a vision tower refuses pictures rather than ignoring them
            require_vision(collect_media(request.messages), has_vision=False, model=self.served_name)
        except GlmError as exc:
            return ErrorReply(exc.status, exc.message, exc.param)
        if self.renderer is None:
            return ErrorReply(400, "this model has no chat template; use /v1/completions", "messages")
        try:  # a renderer or parser refuses a request with a ValueError; ``param`` names the field
            matcher = self._template_matcher(request)
            prompt = self.renderer.render(request)
            parser = self.parser_factory(request)
        except GlmError as exc:
            return ErrorReply(exc.status, exc.message, exc.param)
        except ValueError as exc:
            return ErrorReply(400, str(exc), getattr(exc, "param", None) or "messages")
        ids = self.encode(prompt, add_special_tokens=False)
        prepared = self._admit(ids, request.reply_budget, request, "messages")
        if isinstance(prepared, ErrorReply):
            return prepared
        return replace(prepared, params=replace(prepared.params, constraint=matcher), parser=parser)

    def _template_matcher(self, request: ChatCompletionRequest) -> Any:
        """The structured-output or forced-tool-call matcher of a chat-template model, or None."""
        from sparkfold.glm.grammar import constraint_from_request

        constraint = constraint_from_request(request, "qwen_3")
        if constraint is None:
            return None
        if self._grammar is None:
            tokenizer = self.generator.tokenizer
            if tokenizer is None:
                raise GrammarError(
                    f"{constraint.param}: this engine has no tokenizer to build a grammar with",
                    param=constraint.param,
                )
            from sparkfold.glm.grammar import GrammarCompiler

            stops = sorted(self.generator.eos_token_ids | self.stop_token_ids)
            self._grammar = GrammarCompiler(
                tokenizer,
                vocab_size=self.generator.vocab_size,
                stop_tokens=(),
                stop_token_ids=stops,
                think_end=None,
            )
        return self._grammar.matcher(constraint, thinking=False)

    def tokenize_chat(self, request: ChatCompletionRequest) -> list[int] | ErrorReply:
        """The prompt ids generation renders for ``request`` (``/tokenize``), or the 400 it gets."""
        if self.renderer is None:
            return ErrorReply(400, "this model has no chat template", "messages")
        try:
            prompt = self.renderer.render(request)
        except GlmError as exc:
            return ErrorReply(exc.status, exc.message, exc.param)
        except ValueError as exc:  # a renderer refuses a request with a ValueError naming ``param``
            return ErrorReply(400, str(exc), getattr(exc, "param", None) or "messages")
        return self.encode(prompt, add_special_tokens=False)

    def _prepare_glm(self, request: ChatCompletionRequest, glm: GlmChat) -> Prepared | ErrorReply:
        """Render, load pictures and compile the structured-output grammar (``sparkfold.glm``)."""
        try:
            turn = glm.prepare(request)
        except GlmError as exc:
            return ErrorReply(exc.status, exc.message, exc.param)
        except EngineGone as exc:  # an engine core measures pictures: it may be gone by now
            return unavailable(exc)
        if turn.vision and self.generator.tp > 1:
            return ErrorReply(
                400, "pictures need an engine with tp = 1; remove the image/video parts", "messages"
            )
        ids = self.encode(turn.prompt, add_special_tokens=False)
        prepared = self._admit(ids, request.reply_budget, request, "messages")
        if isinstance(prepared, ErrorReply):
            return prepared
        params = replace(prepared.params, constraint=turn.matcher, prefill_inputs=turn.vision or None)
        think_end = glm.think_end_id if turn.rendered.thinking else None
        return replace(prepared, params=params, parser=turn.parser(), reasoning_end=think_end)

    def prepare_completion(self, request: CompletionRequest) -> list[tuple[Prepared, str]] | ErrorReply:
        """One prepared reply per prompt and choice (prompt-major, as OpenAI orders ``choices``),
        each with the text ``echo`` puts before it."""
        started = time.monotonic()
        error = self._check_common(request)
        if error:
            return error
        if request.echo and request.logprobs is not None:
            return ErrorReply(
                400, "echo with logprobs needs the prompt's log-probabilities; drop one", "echo"
            )
        prompt: Any = request.prompt
        single = isinstance(prompt, str) or isinstance(prompt[0], int)
        prompts: list[str | list[int]] = [prompt] if single else list(prompt)
        out: list[tuple[Prepared, str]] = []
        for i, one in enumerate(prompts):
            param = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
            if isinstance(one, str):
                ids = self.encode(one, add_special_tokens=request.add_special_tokens)
            else:
                ids = list(one)
                bad = self.invalid_token_ids(ids)
                if bad:
                    return ErrorReply(400, bad, param)
            echo = (one if isinstance(one, str) else self.generator.decode(ids)) if request.echo else ""
            for choice in _choices(request, self.seed):
                prepared = self._admit(ids, request.max_tokens, choice, param)
                if isinstance(prepared, ErrorReply):
                    return prepared
                out.append((prepared, echo))
        _stamp([prepared for prepared, _ in out], started)
        return out

    def invalid_token_ids(self, ids: list[int]) -> str | None:
        """Why ``ids`` are not token ids of this model, or None."""
        vocab = self.generator.vocab_size
        if all(0 <= i < vocab for i in ids):
            return None
        return f"token ids must be between 0 and {vocab - 1} (this model's vocabulary)"

    def _admit(
        self,
        ids: list[int],
        budget: int | None,
        request: ChatCompletionRequest | CompletionRequest,
        prompt_field: str,
    ) -> Prepared | ErrorReply:
        window = self.generator.context_length
        if not ids:
            return ErrorReply(400, "the prompt is empty", prompt_field)
        if budget is None:
            budget = min(self.max_tokens, window - len(ids))
        if len(ids) + max(budget, 1) > window:
            return ErrorReply(
                400,
                f"This server's maximum context length is {window} tokens. However, you requested "
                f"{len(ids) + budget} tokens ({len(ids)} in the messages, {budget} in the completion). "
                "Please reduce the length of the messages or completion.",
                prompt_field,
                "context_length_exceeded",
            )
        params = SamplingParams(
            max_tokens=budget,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=max(request.top_k or 0, 0),
            min_p=request.min_p or 0.0,
            seed=self.seed if request.seed is None else request.seed,
            ignore_eos=request.ignore_eos,
            stop_token_ids=frozenset() if request.ignore_eos else self.stop_token_ids,
            draft=getattr(request, "draft", True),
            logprobs=_top_logprobs(request),
        )
        stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        return Prepared(ids, params, stop)


R = TypeVar("R", ChatCompletionRequest, CompletionRequest)


def _stamp(prepared: list[Prepared], started: float) -> list[Prepared]:
    """Record the time since ``started`` (rendering and tokenizing) as each reply's ``prepare_s``."""
    for one in prepared:
        one.params.report.prepare_s = time.monotonic() - started
    return prepared


def _choices(request: R, default_seed: int) -> list[R]:
    """``request`` once per choice; choice ``i`` samples with seed + ``i``."""
    n = request.n or 1
    if n == 1:
        return [request]
    seed = default_seed if request.seed is None else request.seed
    return [request.model_copy(update={"seed": seed + i, "n": 1}) for i in range(n)]


def _top_logprobs(request: ChatCompletionRequest | CompletionRequest) -> int | None:
    """How many alternatives to report per token, or None (no log-probabilities)."""
    if isinstance(request, ChatCompletionRequest):
        return (request.top_logprobs or 0) if request.logprobs else None
    return request.logprobs
