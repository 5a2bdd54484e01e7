"""The generating routes' replies: whole (JSON) or streamed (SSE), one choice or several.

Several choices (``n``, a list of prompts) run one after another in the request's one lane
(:meth:`~sparkfold.engines.service.EngineService.run_choices`), so a request never takes more of
the engine than the gateway admitted; a stream sends them in turn, each chunk naming its choice
``index``. Usage adds the choices' completion tokens and counts each distinct prompt once. With
``logprobs``, each chunk carries the log-probabilities of the tokens it covers
(:mod:`sparkfold.engines.logprobs`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from sparkfold.engines.error_reply import ErrorReply, unavailable
from sparkfold.engines.generator import CapacityError, EngineFailure, EngineGone
from sparkfold.engines.logprobs import LogprobReader, chat_logprobs, completion_logprobs
from sparkfold.engines.outcome import Outcome
from sparkfold.engines.preparing import Prepared
from sparkfold.engines.service import EngineService
from sparkfold.glm.errors import GrammarDeadEnd, without_addresses
from sparkfold.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChunkChoice,
    Completion,
    CompletionChoice,
    Delta,
    ResponseMessage,
    ToolCall,
    Usage,
    new_id,
)
from sparkfold.sse import SSE_DONE, TextEvents, sse_event

__all__ = ["chat_reply", "chat_stream", "completion_reply", "completion_stream", "outcome_error"]

log = logging.getLogger(__name__)


def outcome_error(exc: BaseException) -> ErrorReply:
    if isinstance(exc, GrammarDeadEnd):  # the client's grammar, not the engine: no traceback
        log.info("a reply ended at a grammar dead end: %s", exc.message)
        return ErrorReply(exc.status, exc.message, exc.param, "grammar_dead_end")
    if isinstance(exc, CapacityError):
        return ErrorReply(503, str(exc), None, "capacity", "server_error")
    if isinstance(exc, EngineFailure):
        log.error("generation failed: %s", exc)
        if isinstance(exc, EngineGone):
            return unavailable(exc)
    else:
        log.exception("generation failed")
    return ErrorReply(
        500, f"generation failed: {without_addresses(str(exc))}", None, "engine_error", "server_error"
    )


def usage_of(outcomes: Sequence[Outcome], prompts: Sequence[Prepared]) -> Usage:
    """All choices' usage: completion tokens added up, each distinct prompt counted once."""
    seen: dict[tuple[int, ...], int] = {}
    for prepared, outcome in zip(prompts, outcomes, strict=False):
        seen.setdefault(tuple(prepared.prompt_ids), outcome.prompt_tokens)
    return Usage.of(
        sum(seen.values()),
        sum(len(o.token_ids) for o in outcomes),
        cached=sum(o.report.cached_tokens for o in outcomes),
        reasoning=sum(o.reasoning_tokens for o in outcomes),
    )


def _reader(service: EngineService, prepared: Prepared) -> LogprobReader | None:
    if prepared.params.logprobs is None:
        return None
    ends = service.generator.eos_token_ids | prepared.params.stop_token_ids
    return LogprobReader(prepared.params, service.generator.decode, frozenset(ends))


def _finish(prepared: Prepared, outcome: Outcome) -> str:
    made = prepared.parser.tool_calls_made and outcome.finish_reason == "stop"
    return "tool_calls" if made else outcome.finish_reason


def _merge(deltas: list[Delta]) -> ResponseMessage:
    """One assistant message from its deltas (tool-call arguments concatenated per index)."""
    content = "".join(d.content for d in deltas if d.content)
    reasoning = "".join(d.reasoning_content for d in deltas if d.reasoning_content)
    calls: dict[int, dict[str, Any]] = {}
    for delta in deltas:
        for part in delta.tool_calls or []:
            call = calls.setdefault(part.index, {"id": part.id, "name": "", "arguments": ""})
            call["id"] = call["id"] or part.id
            call["name"] += (part.function or {}).get("name") or ""
            call["arguments"] += (part.function or {}).get("arguments") or ""
    tool_calls = [
        ToolCall(id=c["id"] or new_id("call"), function={"name": c["name"], "arguments": c["arguments"]})  # type: ignore[arg-type]
        for _, c in sorted(calls.items())
    ]
    return ResponseMessage(
        content=content or None, reasoning_content=reasoning or None, tool_calls=tool_calls or None
    )


async def chat_reply(
    service: EngineService, choices: list[Prepared], return_token_ids: bool
) -> ChatCompletion | ErrorReply:
    deltas: list[list[Delta]] = [[] for _ in choices]
    outcomes: list[Outcome] = []
    try:
        async for index, item in service.run_choices(choices):
            parser = choices[index].parser
            if isinstance(item, Outcome):
                deltas[index] += parser.finish(item.finish_reason)
                outcomes.append(item)
            else:
                deltas[index] += parser.feed(item)
    except Exception as exc:
        return outcome_error(exc)
    answers = []
    for index, (prepared, outcome) in enumerate(zip(choices, outcomes, strict=True)):
        reader = _reader(service, prepared)
        choice = Choice(
            index=index,
            message=_merge(deltas[index]),
            logprobs=chat_logprobs(reader, reader.take(final=True)) if reader else None,
            finish_reason=_finish(prepared, outcome),  # type: ignore[arg-type]
            stop_reason=outcome.stop_reason,
        )
        if return_token_ids:
            choice.token_ids = outcome.token_ids  # type: ignore[attr-defined]
        answers.append(choice)
    return ChatCompletion(
        id=new_id(),
        model=service.served_name,
        choices=answers,
        usage=usage_of(outcomes, choices),
        tensorfold=outcomes[0].stats(),
    )


class _ChatChoiceEvents:
    """The SSE events of one streamed chat choice."""

    def __init__(self, service: EngineService, prepared: Prepared, index: int, event: Any) -> None:
        self.index, self.prepared, self.event = index, prepared, event
        self.reader = _reader(service, prepared)
        self.content = TextEvents(event([ChunkChoice(index=index, delta=Delta(content=TextEvents.MARKER))]))
        self.reasoning = TextEvents(
            event([ChunkChoice(index=index, delta=Delta(reasoning_content=TextEvents.MARKER))])
        )

    def _logprobs(self, final: bool = False) -> dict[str, Any] | None:
        return chat_logprobs(self.reader, self.reader.take(final=final)) if self.reader else None

    def chunk(self, delta: Delta, **extra: Any) -> bytes:
        choice = ChunkChoice(index=self.index, delta=delta, logprobs=self._logprobs())
        return sse_event(self.event([choice], **extra))

    def delta(self, delta: Delta) -> bytes:
        """A token's text as content or reasoning takes the fast path (a ready event)."""
        if self.reader is None and delta.role is None and delta.tool_calls is None:
            if delta.reasoning_content is None and delta.content is not None:
                return self.content(delta.content)
            if delta.content is None and delta.reasoning_content is not None:
                return self.reasoning(delta.reasoning_content)
        return self.chunk(delta)

    def end(self, outcome: Outcome, usage: Usage | None) -> bytes:
        choice = ChunkChoice(
            index=self.index,
            delta=Delta(),
            logprobs=self._logprobs(final=True),
            finish_reason=_finish(self.prepared, outcome),  # type: ignore[arg-type]
            stop_reason=outcome.stop_reason,
        )
        return sse_event(self.event([choice], usage=usage, tensorfold=outcome.stats()))


async def chat_stream(
    service: EngineService, choices: list[Prepared], usage_chunk: bool, prompt_usage: bool
) -> AsyncIterator[bytes]:
    """The chat SSE; ``prompt_usage`` (``continuous_usage_stats``) puts the prompt's usage on the
    role chunk too, so a translator knows the input tokens before the reply starts."""
    ident, name, created = new_id(), service.served_name, int(time.time())

    def event(choices: list[ChunkChoice], **extra: Any) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=ident, model=name, created=created, choices=choices, **extra)

    outcomes: list[Outcome] = []
    current: _ChatChoiceEvents | None = None
    last = len(choices) - 1
    try:
        async for index, item in service.run_choices(choices):
            if current is None or current.index != index:
                current = _ChatChoiceEvents(service, choices[index], index, event)
                opening = Usage.of(len(choices[0].prompt_ids), 0) if prompt_usage and index == 0 else None
                yield current.chunk(Delta(role="assistant", content=""), usage=opening)
            parser = choices[index].parser
            if isinstance(item, Outcome):
                for delta in parser.finish(item.finish_reason):
                    yield current.chunk(delta)
                outcomes.append(item)
                yield current.end(item, usage_of(outcomes, choices) if index == last else None)
            else:
                for delta in parser.feed(item):
                    yield current.delta(delta)
        if usage_chunk:
            yield sse_event(event([], usage=usage_of(outcomes, choices)))
    except Exception as exc:
        yield sse_event(outcome_error(exc).body())
    yield SSE_DONE


async def completion_reply(
    service: EngineService, choices: list[tuple[Prepared, str]], return_token_ids: bool
) -> Completion | ErrorReply:
    prompts = [prepared for prepared, _ in choices]
    pieces: list[list[str]] = [[echo] for _, echo in choices]
    outcomes: list[Outcome] = []
    try:
        async for index, item in service.run_choices(prompts):
            if isinstance(item, Outcome):
                outcomes.append(item)
            else:
                pieces[index].append(item)
    except Exception as exc:
        return outcome_error(exc)
    answers = []
    for index, (prepared, outcome) in enumerate(zip(prompts, outcomes, strict=True)):
        reader = _reader(service, prepared)
        choice = CompletionChoice(
            index=index,
            text="".join(pieces[index]),
            logprobs=completion_logprobs(reader, reader.take(final=True)) if reader else None,
            finish_reason=outcome.finish_reason,  # type: ignore[arg-type]
            stop_reason=outcome.stop_reason,
        )
        if return_token_ids:
            choice.token_ids = outcome.token_ids  # type: ignore[attr-defined]
        answers.append(choice)
    return Completion(
        id=new_id("cmpl"),
        model=service.served_name,
        choices=answers,
        usage=usage_of(outcomes, prompts),
        tensorfold=outcomes[0].stats(),
    )


async def completion_stream(
    service: EngineService, choices: list[tuple[Prepared, str]], usage_chunk: bool
) -> AsyncIterator[bytes]:
    ident, name, created = new_id("cmpl"), service.served_name, int(time.time())
    prompts = [prepared for prepared, _ in choices]

    def event(choice: CompletionChoice, **extra: Any) -> bytes:
        return sse_event(Completion(id=ident, model=name, created=created, choices=[choice], **extra))

    def text_events(index: int) -> TextEvents:
        choice = CompletionChoice(index=index, text=TextEvents.MARKER)
        return TextEvents(Completion(id=ident, model=name, created=created, choices=[choice]))

    outcomes: list[Outcome] = []
    current = -1
    reader: LogprobReader | None = None
    text_event = text_events(0)
    last = len(choices) - 1
    try:
        async for index, item in service.run_choices(prompts):
            if index != current:
                current, reader, text_event = index, _reader(service, prompts[index]), text_events(index)
                echo = choices[index][1]
                if echo:
                    yield text_event(echo)
            if isinstance(item, Outcome):
                outcomes.append(item)
                end = CompletionChoice(
                    index=index,
                    text="",
                    logprobs=completion_logprobs(reader, reader.take(final=True)) if reader else None,
                    finish_reason=item.finish_reason,  # type: ignore[arg-type]
                    stop_reason=item.stop_reason,
                )
                yield event(
                    end, usage=usage_of(outcomes, prompts) if index == last else None, tensorfold=item.stats()
                )
            elif reader is not None:
                logprobs = completion_logprobs(reader, reader.take())
                yield event(CompletionChoice(index=index, text=item, logprobs=logprobs))
            else:
                yield text_event(item)
        if usage_chunk:
            yield sse_event(Completion(id=ident, model=name, choices=[], usage=usage_of(outcomes, prompts)))
    except Exception as exc:
        yield sse_event(outcome_error(exc).body())
    yield SSE_DONE
