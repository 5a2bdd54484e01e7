"""Serving logic of our engine servers: requests in, text pieces and outcomes out.

:class:`EngineService` validates a request against the engine (window, capacity, unsupported
fields), renders chat prompts, runs the generator and turns token ids into text (stop strings,
incremental decoding), keeping the counters. Client mistakes come back as :class:`ErrorReply`
values; ``server.py`` maps them to HTTP.

Two rules keep the event loop free and the gateway in charge of capacity:

- rendering, tokenizing, picture decoding and grammar compilation run in a worker thread
  (:meth:`EngineService.off_loop`), never on the event loop that streams every other reply nor
  on the engine thread that steps the model; a request body past :data:`LONG_BODY_BYTES` gets a
  worker of its own, so a short request is not prepared behind a long prompt (seconds at 1M
  tokens);
- the gateway is the admission authority: a request that finds every lane taken waits briefly
  for one (:meth:`EngineService.wait_for_lane`; a job whose client just left is still being
  released) before it is refused with 503 ``capacity``, which the gateway retries.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from sparkfold.config import FORCED_CALLS_PER_TOOL
from sparkfold.engines.chat_template import ChatRenderer, ChatTemplateRenderer
from sparkfold.engines.generator import EngineGone, GenerationReport, Generator, SamplingParams
from sparkfold.engines.metrics import EngineCounters
from sparkfold.engines.output import OutputParser, ParserFactory, PlainParser, TextStream, plain_parser
from sparkfold.engines.prompt_ids import PromptIds
from sparkfold.glm.errors import GlmError, GrammarError
from sparkfold.glm.media import collect_media, require_vision
from sparkfold.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EngineCapabilities,
    EngineHealth,
    ErrorInfo,
    ErrorResponse,
    PeerState,
    ignored_fields,
    ignored_summary,
)

if TYPE_CHECKING:
    from sparkfold.glm.chat import GlmChat

__all__ = ["FOLLOW_S", "LONG_BODY_BYTES", "EngineService", "ErrorReply", "Outcome", "Prepared", "unavailable"]

log = logging.getLogger(__name__)

T = TypeVar("T")

LONG_BODY_BYTES = 262_144
"""A request body past this is prepared in the long prompts' worker (:meth:`EngineService.off_loop`)."""
FOLLOW_S = 2.0
"""How long a request that found every lane taken waits for one before the 503 ``capacity``."""


@dataclass(frozen=True)
class ErrorReply:
    """A refused request: HTTP status plus the OpenAI error body."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    type: str = "invalid_request_error"

    def body(self) -> ErrorResponse:
        return ErrorResponse(
            error=ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code)
        )


def unavailable(exc: EngineGone) -> ErrorReply:
    """The engine's process is gone: 503 ``engine_unavailable`` (retried by clients and the gateway)."""
    return ErrorReply(503, str(exc), None, "engine_unavailable", "server_error")


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


@dataclass
class Outcome:
    """How a generation ended."""

    finish_reason: str
    prompt_tokens: int
    token_ids: list[int]
    prefill_s: float
    decode_s: float
    report: GenerationReport = field(default_factory=GenerationReport)
    stop_reason: str | None = None
    """The stop string that ended the reply, if one did."""
    reasoning_tokens: int = 0

    def stats(self) -> dict[str, object]:
        """The ``tensorfold`` stats block."""
        digest = hashlib.sha256(",".join(map(str, self.token_ids)).encode()).hexdigest()[:16]
        rate = (
            (len(self.token_ids) - 1) / self.decode_s if self.decode_s > 0 and len(self.token_ids) > 1 else 0
        )
        return {
            "prefill_s": round(self.prefill_s, 4),
            "decode_s": round(self.decode_s, 4),
            "decode_tok_s": round(rate, 2),
            "cached": self.report.cached_tokens,
            "rounds": 0,
            "drafted": self.report.drafted,
            "accepted": self.report.accepted,
            "token_sha": digest,
            "prepare_s": round(self.report.prepare_s, 4),
            **(
                {"phases_s": {k: round(v, 4) for k, v in self.report.phases_s.items()}}
                if self.report.phases_s
                else {}
            ),
        }


class EngineService:
    """The engine protocol's logic over one :class:`Generator`.

    ``renderer`` and ``parser_factory`` default to the checkpoint's chat template and plain
    content; a GLM model brings ``glm`` (the generator's ``glm`` attribute by default) and then
    prompts, reasoning, tool calls, structured outputs and pictures follow ``sparkfold.glm``;
    ``peer_state`` (from the node supervisor) fills ``/health``'s peer block.
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
        peer_state: Callable[[], PeerState | None] | None = None,
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
        self.peer_state = peer_state or (lambda: None)
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
        self.counters = EngineCounters()
        self.encode = PromptIds(generator.encode)
        """The generator's tokenizer, with the ids of recent long prompts kept (a re-sent prompt)."""
        self._prepare = ThreadPoolExecutor(1, thread_name_prefix="prepare")
        """Prompt work (render, tokenize, pictures, grammar) off the event loop, one at a time."""
        self._prepare_long = ThreadPoolExecutor(1, thread_name_prefix="prepare-long")
        """The same for long request bodies, one at a time, beside the short ones."""
        self._lane_waiters: list[asyncio.Future[None]] = []
        self._held = 0
        """Lanes kept by a request between two of its choices (:meth:`run_choices`)."""
        self.ready = True
        """False until the supervisor's start-up probe answered: ``/health`` says ``ok`` only then."""

    # --- admission ------------------------------------------------------------------------------

    def _check_common(self, request: ChatCompletionRequest | CompletionRequest) -> ErrorReply | None:
        if request.model and request.model != self.served_name:
            return ErrorReply(
                404,
                f"The model `{request.model}` does not exist; this server serves `{self.served_name}`.",
                "model",
                "model_not_found",
            )
        wants = request.logprobs not in (None, False) or getattr(request, "top_logprobs", None)
        if wants and not self.supports_logprobs:
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

    @property
    def supports_logprobs(self) -> bool:
        return self.generator.supports_logprobs

    def capabilities(self) -> EngineCapabilities:
        """What ``/v1/models`` tells the gateway this engine can do."""
        return EngineCapabilities(backend=self.generator.backend, logprobs=self.supports_logprobs)

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

    async def off_loop(self, work: Callable[..., T], *args: object, body_bytes: int = 0) -> T:
        """``work(*args)`` in a prompt worker thread (rendering, tokenizing, pictures, grammar): the
        long prompts' one when the request's body has more than :data:`LONG_BODY_BYTES`."""
        worker = self._prepare_long if body_bytes > LONG_BODY_BYTES else self._prepare
        return await asyncio.get_running_loop().run_in_executor(worker, work, *args)

    async def wait_for_lane(self) -> ErrorReply | None:
        """None once a lane is free; the 503 ``capacity`` if none freed within :data:`FOLLOW_S`."""
        parallel = self.generator.parallel
        loop = asyncio.get_running_loop()
        give_up = loop.time() + FOLLOW_S
        while self.counters.requests_running + self._held >= parallel:
            left = give_up - loop.time()
            if left <= 0:
                return ErrorReply(
                    503,
                    f"the engine is at capacity ({parallel} requests); retry",
                    None,
                    "capacity",
                    "server_error",
                )
            freed: asyncio.Future[None] = loop.create_future()
            self._lane_waiters.append(freed)
            try:
                await asyncio.wait([freed], timeout=left)
            finally:
                if freed in self._lane_waiters:
                    self._lane_waiters.remove(freed)
        return None

    def _lane_freed(self) -> None:
        waiters, self._lane_waiters = self._lane_waiters, []
        for freed in waiters:
            if not freed.done():
                freed.set_result(None)

    # --- generation -----------------------------------------------------------------------------

    async def run_choices(self, choices: Sequence[Prepared]) -> AsyncIterator[tuple[int, str | Outcome]]:
        """Each choice's pieces and outcome (with its index), the choices one after another.

        The request keeps its one lane from the first choice to the last: between two choices the
        lane is held (no other request is let in), and the next choice takes it back before any
        await, so a request with ``n`` choices never needs a second lane nor meets a capacity
        refusal half-way.
        """
        held = False
        last = len(choices) - 1
        try:
            for index, prepared in enumerate(choices):
                if held:  # run() counts itself as running before its first await
                    self._held -= 1
                    held = False
                async for item in self.run(prepared, release=index == last):
                    if isinstance(item, Outcome) and index < last:
                        self._held += 1
                        held = True
                    yield index, item
        finally:
            if held:
                self._held -= 1
            self._lane_freed()

    async def run(self, prepared: Prepared, *, release: bool = True) -> AsyncIterator[str | Outcome]:
        """Text pieces as they become final, then one :class:`Outcome`.

        Leaving the iteration early (client gone) cancels the generation. ``release=False`` (a
        request with more choices to run) does not wake the requests waiting for a lane.
        """
        counters, generator = self.counters, self.generator
        cancel = threading.Event()
        text = TextStream(generator.decode, prepared.stop)
        ids: list[int] = []
        finish = "length"
        started = time.monotonic()
        first = started
        counters.started(len(prepared.prompt_ids))
        tokens = generator.generate(prepared.prompt_ids, prepared.params, cancel)
        try:
            async for token in tokens:
                if not ids:
                    first = time.monotonic()
                ids.append(token)
                counters.token()
                ended = token in generator.eos_token_ids and not prepared.params.ignore_eos
                if ended or token in prepared.params.stop_token_ids:
                    finish = "stop"
                    break
                piece = text.push(token)
                if piece:
                    yield piece
                if text.stopped or prepared.parser.ended:  # the parser may end a reply (a repeated call)
                    finish = "stop"
                    break
            tail = text.flush()
            if tail:
                yield tail
        except (GeneratorExit, asyncio.CancelledError):
            finish = "abort"  # the client left
            raise
        except Exception:
            finish = "error"
            raise
        finally:
            cancel.set()
            if isinstance(tokens, AsyncGenerator):  # the protocol promises only an AsyncIterator
                await tokens.aclose()
            now = time.monotonic()
            counters.finished(finish, first - started, now - first if ids else 0.0)
            if release:
                self._lane_freed()
        report = prepared.params.report
        counters.reported(report.cached_tokens, report.drafted, report.accepted)
        end = prepared.reasoning_end
        reasoning = 0 if end is None else (ids.index(end) if end in ids else len(ids))
        yield Outcome(
            finish,
            len(prepared.prompt_ids),
            ids,
            first - started,
            now - first,
            report,
            text.matched,
            reasoning,
        )

    # --- status ---------------------------------------------------------------------------------

    def health(self) -> EngineHealth:
        peer = self.peer_state()
        c = self.counters
        return EngineHealth(
            ok=self.ready and self.generator.healthy() and (peer is None or peer.state != "lost"),
            backend=self.generator.backend,
            busy=c.requests_running > 0,
            requests_running=c.requests_running,
            requests_total=c.requests_total,
            prompt_tokens_total=c.prompt_tokens_total,
            completion_tokens_total=c.completion_tokens_total,
            prefill_seconds_total=round(c.prefill_seconds_total, 6),
            decode_seconds_total=round(c.decode_seconds_total, 6),
            cached_tokens_total=c.cached_tokens_total,
            drafted_total=c.drafted_total,
            accepted_total=c.accepted_total,
            context_length=self.generator.context_length,
            streams=self.generator.parallel,
            peer=peer,
            pool=self.generator.pool_stats(),
            stalled_s=round(stall, 3) if (stall := self.generator.stalled_s()) is not None else None,
        )


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
