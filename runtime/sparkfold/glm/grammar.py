"""Structured outputs with xgrammar: request constraints → compiled grammars → token matchers.

:func:`constraint_from_request` reads ``response_format`` (``json_object`` / ``json_schema``),
``guided_json``, ``guided_regex``, ``guided_choice`` and ``guided_grammar`` (EBNF), and forced
tool calls (``tool_choice`` ``"required"`` or a named function, ``parallel_tool_calls: false``):
those become an xgrammar structural tag in the model's tool-call format (:data:`ToolFormat`:
``glm_4_7`` is GLM-5's ``<tool_call>NAME<arg_key>…``, ``qwen_3`` the JSON-in-``<tool_call>`` form
our chat-template models use), built by xgrammar's own ``get_model_structural_tag``.
:class:`GrammarCompiler` compiles one for a tokenizer (a constraint xgrammar cannot compile is a
:class:`~sparkfold.glm.errors.GrammarError` naming the field and xgrammar's reason). Two repairs
on top of xgrammar 0.2.9: the tokenizer's special tokens (``[gMASK]``, ``<|image|>``, ``<think>``
…) are never text a grammar may produce (xgrammar would spell them inside a JSON string), and a
length-bounded JSON string (``minLength`` / ``maxLength``) refuses raw control characters as every
other JSON string does (xgrammar's bounded-string rule lets ``\x00``-``\x1f`` through).

:class:`ConstrainedMatcher` is the engine-agnostic part: fill a packed int32 token bitmask (bit
``i & 31`` of word ``i >> 5``, the layout exllamav3 filters use too), accept a token,
``is_terminated``, roll back. Its grammar waits until the think block has closed (the
``</think>`` token), so it never blocks reasoning or ``</think>`` itself; with thinking off it
holds from the first token. While it waits, only the stop tokens are refused: a constrained reply
cannot end its turn inside its reasoning, it must close it and then write what the grammar asks
(a forced call, the JSON object); ``max_tokens`` still cuts it anywhere (``length``). Its stop
tokens are :data:`~sparkfold.glm.tokens.STOP_TOKENS` (an engine must stop on all four,
``<|assistant|>`` included). ``sparkfold.glm.logits`` adapts it to transformers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import torch
import xgrammar as xgr
from xgrammar.structural_tag import OrFormat, PlusFormat, TokenTriggeredTagsFormat, TriggeredTagsFormat

from sparkfold.glm.errors import GrammarDeadEnd, GrammarError, without_addresses
from sparkfold.glm.finite import derives_a_string
from sparkfold.glm.messages import normalise_tools
from sparkfold.glm.tokens import STOP_TOKENS, THINK_END

__all__ = [
    "TOOL_MARKERS",
    "ConstrainedMatcher",
    "GrammarCompiler",
    "MatcherFactory",
    "MatcherSpec",
    "OutputConstraint",
    "ToolFormat",
    "allocate_bitmask",
    "apply_bitmask",
    "client_reason",
    "constraint_from_request",
    "strict_json_grammar",
    "tool_constraint",
]

ConstraintKind = Literal["json_schema", "regex", "choice", "grammar", "structural_tag"]
ToolFormat = Literal["glm_4_7", "qwen_3"]
"""xgrammar's names of the tool-call formats our engines speak."""

#: GLM-5's control tokens that a tool-call grammar matches as tokens (xgrammar's ``token_markers``).
TOOL_MARKERS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
)
MAX_WHITESPACE = 2
"""Whitespace a tool-call grammar allows in a row (a newline and an indent; never a run of it)."""
_BOUNDED_STRING_CHAR = r"[^\"\\\r\n]"
"""The character class of xgrammar's rule for a JSON string with ``minLength`` / ``maxLength``."""
_JSON_STRING_CHAR = r"[^\0-\x1f\"\\\r\n]"
"""The one JSON allows unescaped (what xgrammar uses for unbounded strings)."""


@dataclass(frozen=True)
class OutputConstraint:
    """One structured-output request: ``kind``, its text (schema JSON, regex, EBNF) and its field."""

    kind: ConstraintKind
    value: str
    param: str


@dataclass(frozen=True)
class MatcherSpec:
    """A fresh :class:`ConstrainedMatcher`'s recipe: picklable, unlike the matcher (xgrammar state)."""

    constraint: OutputConstraint
    vocab_size: int
    stop_token_ids: tuple[int, ...]
    trigger_token_id: int | None


class MatcherFactory:
    """Builds the matcher a :class:`MatcherSpec` describes for one tokenizer (a compiler per vocabulary)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._compilers: dict[tuple[int, tuple[int, ...]], GrammarCompiler] = {}

    def build(self, spec: MatcherSpec) -> ConstrainedMatcher:
        key = (spec.vocab_size, spec.stop_token_ids)
        compiler = self._compilers.get(key)
        if compiler is None:
            compiler = self._compilers[key] = GrammarCompiler(
                self._tokenizer,
                vocab_size=spec.vocab_size,
                stop_tokens=(),
                stop_token_ids=spec.stop_token_ids,
                think_end=None,
            )
        return ConstrainedMatcher(
            compiler.compile(spec.constraint),
            vocab_size=spec.vocab_size,
            trigger_token_id=spec.trigger_token_id,
            stop_token_ids=spec.stop_token_ids,
            spec=spec,
        )


def _schema_text(schema: Any, param: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise GrammarError(f"the schema is not valid JSON: {exc.msg}", param=param) from None
    if not isinstance(schema, Mapping):
        raise GrammarError("the schema must be a JSON object", param=param)
    return json.dumps(schema, sort_keys=True)


def _choice_grammar(choices: Sequence[str]) -> str:
    if not choices or not all(isinstance(c, str) for c in choices):
        raise GrammarError("guided_choice needs a non-empty list of strings", param="guided_choice")
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _response_format(fmt: Mapping[str, Any]) -> OutputConstraint | None:
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return OutputConstraint("json_schema", json.dumps({"type": "object"}), "response_format")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, Mapping) or "schema" not in spec:
            raise GrammarError("json_schema needs a 'schema' object", param="response_format.json_schema")
        param = "response_format.json_schema.schema"
        return OutputConstraint("json_schema", _schema_text(spec["schema"], param), param)
    raise GrammarError(
        f"unsupported response_format type {kind!r}; use text, json_object or json_schema",
        param="response_format.type",
    )


def _forces_tools(request: Any) -> bool:
    choice = getattr(request, "tool_choice", None)
    forced = choice == "required" or isinstance(choice, Mapping)
    return forced or (getattr(request, "parallel_tool_calls", None) is False and choice != "none")


def tool_constraint(request: Any, tool_format: ToolFormat) -> OutputConstraint | None:
    """The grammar of a forced tool call (``tool_choice`` required or named, or at most one call).

    ``tool_choice: "auto"`` with parallel calls allowed, or ``"none"``, leaves the reply free.
    """
    tools = getattr(request, "tools", None)
    if not tools or not _forces_tools(request):
        return None
    choice = getattr(request, "tool_choice", None)
    parallel = getattr(request, "parallel_tool_calls", None) is not False
    try:
        tag = xgr.get_model_structural_tag(
            tool_format,
            tools=list[Any](normalise_tools(tools)),  # ``strict: false`` would leave the arguments free
            tool_choice=choice if choice is not None else "auto",
            reasoning="disabled",  # the matcher itself waits for </think>
            parallel_tool_calls=parallel,
            token_markers=tool_format == "glm_4_7",
            max_whitespace_cnt=MAX_WHITESPACE,
        )
    except (ValueError, TypeError) as exc:
        raise GrammarError(
            f"cannot force this tool call: {client_reason(exc)}", param="tool_choice"
        ) from None
    calls = tag.format
    if (
        isinstance(calls, TriggeredTagsFormat | TokenTriggeredTagsFormat)
        and calls.at_least_one
        and not calls.stop_after_first
    ):
        # "required" with parallel calls: xgrammar's "one or more calls, any text around them" lets a
        # model write on after its calls until max_tokens; a forced reply is its calls alone (how
        # many: the GLM parser bounds it, sparkfold.glm.chat.forced_call_cap)
        tag.format = PlusFormat(content=OrFormat(elements=list(calls.tags)))
    return OutputConstraint("structural_tag", tag.model_dump_json(), "tool_choice")


def constraint_from_request(request: Any, tool_format: ToolFormat | None = None) -> OutputConstraint | None:
    """The one structured-output constraint a chat request asks for, or ``None``.

    With ``tool_format``, a forced tool call is a constraint too (:func:`tool_constraint`).
    """
    found: list[OutputConstraint] = []
    if tool_format is not None and (tool := tool_constraint(request, tool_format)) is not None:
        found.append(tool)
    fmt = getattr(request, "response_format", None)
    if isinstance(fmt, Mapping) and (c := _response_format(fmt)) is not None:
        found.append(c)
    if (schema := getattr(request, "guided_json", None)) is not None:
        found.append(OutputConstraint("json_schema", _schema_text(schema, "guided_json"), "guided_json"))
    if (regex := getattr(request, "guided_regex", None)) is not None:
        found.append(OutputConstraint("regex", regex, "guided_regex"))
    if (choices := getattr(request, "guided_choice", None)) is not None:
        found.append(OutputConstraint("choice", _choice_grammar(choices), "guided_choice"))
    if (ebnf := getattr(request, "guided_grammar", None)) is not None:
        found.append(OutputConstraint("grammar", ebnf, "guided_grammar"))
    if len(found) > 1:
        names = ", ".join(c.param for c in found)
        raise GrammarError(f"ask for one structured output at a time, not {names}", param=found[1].param)
    return found[0] if found else None


def allocate_bitmask(vocab_size: int, batch: int = 1) -> torch.Tensor:
    """A packed int32 bitmask for ``batch`` rows (all tokens allowed)."""
    return xgr.allocate_token_bitmask(batch, vocab_size)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, indices: list[int] | None = None) -> None:
    """Set the logits of disallowed tokens to -inf, in place (CPU or CUDA)."""
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=indices)


class ConstrainedMatcher:
    """Grammar state of one reply. Inactive until ``trigger_token_id`` (``</think>``) is accepted."""

    def __init__(
        self,
        compiled: xgr.CompiledGrammar,
        *,
        vocab_size: int,
        trigger_token_id: int | None,
        stop_token_ids: Sequence[int] = (),
        spec: MatcherSpec | None = None,
    ) -> None:
        self._matcher = xgr.GrammarMatcher(compiled)
        self.spec = spec
        self._kind = spec.constraint.kind if spec is not None else "grammar"
        self._param = spec.constraint.param if spec is not None else None
        """What it was built from: another process (an engine core) builds the same one from it."""
        self.vocab_size = vocab_size
        self.stop_token_ids = tuple(stop_token_ids)
        self._trigger = trigger_token_id
        self.active = trigger_token_id is None
        self._history: list[bool] = []  # per accepted token: did the grammar see it?
        self._trigger_at: int | None = None  # history index of the accepted trigger token
        self.dead_end: GrammarDeadEnd | None = None
        """Set when a step allowed no token (only the stops were offered): the reply must end with it."""

    def accept_token(self, token_id: int) -> bool:
        """Advance by one generated token; ``False`` (state unchanged) if the grammar rejects it."""
        if not self.active:
            if token_id == self._trigger:
                self._trigger_at = len(self._history)
                self.active = True
            self._history.append(False)
            return True
        accepted = bool(self._matcher.accept_token(int(token_id)))
        if accepted:
            self._history.append(True)
        return accepted

    def fill_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> bool:
        """Write the allowed tokens into row ``index``: while inactive (reasoning), every token but
        the stops; then the grammar's.

        A step where the grammar allows no token at all (a dead end: the vocabulary cannot spell
        what the grammar needs next) is never a sample from an all ``-inf`` row: the row offers
        the stop tokens only and :attr:`dead_end` is set, so the engine ends the reply with that
        error."""
        if not self.active:
            self._all_but_stops(bitmask[index])
            return True
        if self._matcher.is_terminated():  # done: only a stop token may follow
            self._only_stops(bitmask[index])
            return True
        self._matcher.fill_next_token_bitmask(bitmask, index)
        if not bool(bitmask[index].any()):
            self.dead_end = GrammarDeadEnd(
                f"the {self._kind} allows no token after {sum(self._history)} tokens of output; "
                "no reply can match it with this model's vocabulary",
                param=self._param,
            )
            self._only_stops(bitmask[index])
        return True

    def _only_stops(self, row: torch.Tensor) -> None:
        row.zero_()
        for token in self.stop_token_ids:
            row[token >> 5] |= _bit(token)

    def _all_but_stops(self, row: torch.Tensor) -> None:
        row.fill_(-1)
        for token in self.stop_token_ids:
            row[token >> 5] &= ~_bit(token)

    def is_terminated(self) -> bool:
        return self.active and bool(self._matcher.is_terminated())

    def rollback(self, count: int) -> None:
        """Undo the last ``count`` accepted tokens (draft rejection)."""
        count = min(count, len(self._history))
        if count <= 0:
            return
        undone = self._history[-count:]
        del self._history[-count:]
        if sum(undone):
            self._matcher.rollback(sum(undone))
        self.dead_end = None  # (met on a drafted token: the verified path is judged again)
        if self._trigger_at is not None and self._trigger_at >= len(self._history):
            self._trigger_at = None
            self.active = False

    def reset(self) -> None:
        self._matcher.reset()
        self.dead_end = None
        self._history.clear()
        self._trigger_at = None
        self.active = self._trigger is None


def _bit(token: int) -> int:
    """``token``'s bit in its int32 bitmask word (bit 31 is the sign)."""
    bit = token & 31
    return (1 << bit) if bit < 31 else -(1 << 31)


# xgrammar's messages start with a time and its C++ source location, and a binding error may name
# an object's address: none of it helps a client, and it tells an attacker what runs here.
_SOURCE_PREFIX = re.compile(r"^\s*(?:\[[\d:.]+\]\s*)?(?:\S+\.(?:cc|cpp|h|hpp|py):\d+:\s*)?")


def client_reason(exc: BaseException) -> str:
    """The first line of ``exc``'s message without source paths or object addresses."""
    lines = str(exc).strip().splitlines()
    reason = without_addresses(_SOURCE_PREFIX.sub("", lines[0])) if lines else ""
    return reason or type(exc).__name__


def strict_json_grammar(schema: str) -> str:
    """The EBNF of ``schema`` where no JSON string holds a raw control character."""
    ebnf = str(xgr.Grammar.from_json_schema(schema, any_whitespace=False))
    return ebnf.replace(_BOUNDED_STRING_CHAR, _JSON_STRING_CHAR)


def _tokenizer_info(
    tokenizer: Any, vocab_size: int, stop_ids: Sequence[int], keep: Sequence[str]
) -> xgr.TokenizerInfo:
    """xgrammar's view of ``tokenizer`` where special tokens (except stops and ``keep``) spell nothing.

    An empty token is special to xgrammar: no grammar ever allows it.
    """
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_ids))
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special = {
        i for i, token in added.items() if token.special and token.content not in keep and i < vocab_size
    } - set(stop_ids)
    if not special:
        return info
    vocab = [b"" if i in special else text for i, text in enumerate(info.decoded_vocab)]
    return xgr.TokenizerInfo(
        vocab,
        xgr.VocabType.RAW,
        vocab_size=vocab_size,
        stop_token_ids=list(stop_ids),
        add_prefix_space=info.add_prefix_space,
    )


class GrammarCompiler:
    """Compiles constraints for one tokenizer (Hugging Face ``PreTrainedTokenizerBase``).

    ``stop_tokens`` end a reply once the grammar is done (GLM's four by default); ``think_end``
    is the token after which a thinking reply's grammar starts.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        vocab_size: int | None = None,
        stop_tokens: Sequence[str] = STOP_TOKENS,
        stop_token_ids: Sequence[int] = (),
        think_end: str | None = THINK_END,
    ) -> None:
        vocab = tokenizer.get_vocab()
        stop_ids = sorted({vocab[t] for t in stop_tokens if t in vocab} | set(stop_token_ids))
        self.vocab_size = vocab_size or len(tokenizer)
        self.stop_token_ids = stop_ids
        self._tokenizer = tokenizer
        info = _tokenizer_info(tokenizer, self.vocab_size, stop_ids, keep=())
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self.think_end_id: int | None = vocab.get(think_end) if think_end else None

    @cached_property
    def _tool_compiler(self) -> xgr.GrammarCompiler:
        """For tool-call grammars: the markers (``<tool_call>`` …) stay tokens it may produce."""
        info = _tokenizer_info(self._tokenizer, self.vocab_size, self.stop_token_ids, keep=TOOL_MARKERS)
        return xgr.GrammarCompiler(info, max_threads=1)

    def compile(self, constraint: OutputConstraint) -> xgr.CompiledGrammar:
        """Compile ``constraint``; a :class:`GrammarError` names the field and the reason (one
        that no finite string matches included: :func:`~sparkfold.glm.finite.derives_a_string`)."""
        try:
            if constraint.kind == "structural_tag":
                return self._tool_compiler.compile_structural_tag(constraint.value)
            if constraint.kind == "json_schema":
                grammar = xgr.Grammar.from_ebnf(strict_json_grammar(constraint.value))
            elif constraint.kind == "regex":
                grammar = xgr.Grammar.from_regex(constraint.value)
            else:
                grammar = xgr.Grammar.from_ebnf(constraint.value)
            if derives_a_string(grammar):
                return self._compiler.compile_grammar(grammar)
        except (RuntimeError, ValueError, TypeError) as exc:
            reason = client_reason(exc)
            raise GrammarError(
                f"cannot compile this {constraint.kind}: {reason}", param=constraint.param
            ) from None
        raise GrammarError(
            f"no finite string matches this {constraint.kind}: every derivation of its root recurses "
            'forever (like root ::= root "a"); give each recursive rule an alternative that ends',
            param=constraint.param,
        )

    def matcher(self, constraint: OutputConstraint, *, thinking: bool) -> ConstrainedMatcher:
        """A fresh matcher; with ``thinking`` it waits for ``</think>`` before constraining."""
        spec = MatcherSpec(
            constraint, self.vocab_size, tuple(self.stop_token_ids), self.think_end_id if thinking else None
        )
        return ConstrainedMatcher(
            self.compile(constraint),
            vocab_size=spec.vocab_size,
            trigger_token_id=spec.trigger_token_id,
            stop_token_ids=spec.stop_token_ids,
            spec=spec,
        )
