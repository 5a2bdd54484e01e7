"""Structured outputs with xgrammar: request constraints → compiled grammars → token matchers.

:func:`constraint_from_request` reads ``response_format`` (``json_object`` / ``json_schema``),
``guided_json``, ``guided_regex``, ``guided_choice`` and ``guided_grammar`` (EBNF);
:class:`GrammarCompiler` compiles one for a tokenizer (a constraint xgrammar cannot compile is a
:class:`~sparkfold.glm.errors.GrammarError` naming the field and xgrammar's reason).

:class:`ConstrainedMatcher` is the engine-agnostic part: fill a packed int32 token bitmask (bit
``i & 31`` of word ``i >> 5``, the layout exllamav3 filters use too), accept a token,
``is_terminated``, roll back. It stays inactive until the think block has closed (the
``</think>`` token), so a grammar never blocks reasoning or ``</think>`` itself; with thinking
off it is active from the first token. Its stop tokens are :data:`~sparkfold.glm.tokens.STOP_TOKENS`
(an engine must stop on all four, ``<|assistant|>`` included). ``sparkfold.glm.logits`` adapts it
to transformers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import xgrammar as xgr

from sparkfold.glm.errors import GrammarError
from sparkfold.glm.tokens import STOP_TOKENS, THINK_END

__all__ = [
    "ConstrainedMatcher",
    "GrammarCompiler",
    "OutputConstraint",
    "allocate_bitmask",
    "apply_bitmask",
    "client_reason",
    "constraint_from_request",
]

ConstraintKind = Literal["json_schema", "regex", "choice", "grammar"]


@dataclass(frozen=True)
class OutputConstraint:
    """One structured-output request: ``kind``, its text (schema JSON, regex, EBNF) and its field."""

    kind: ConstraintKind
    value: str
    param: str


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


def constraint_from_request(request: Any) -> OutputConstraint | None:
    """The one structured-output constraint a chat request asks for, or ``None``."""
    found: list[OutputConstraint] = []
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
    ) -> None:
        self._matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.stop_token_ids = tuple(stop_token_ids)
        self._trigger = trigger_token_id
        self.active = trigger_token_id is None
        self._history: list[bool] = []  # per accepted token: did the grammar see it?
        self._trigger_at: int | None = None  # history index of the accepted trigger token

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
        """Write the allowed tokens into row ``index``; ``False`` (row untouched) while inactive."""
        if not self.active:
            return False
        if self._matcher.is_terminated():  # done: only a stop token may follow
            row = bitmask[index]
            row.zero_()
            for token in self.stop_token_ids:
                bit = token & 31
                row[token >> 5] |= (1 << bit) if bit < 31 else -(1 << 31)
            return True
        self._matcher.fill_next_token_bitmask(bitmask, index)
        return True

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
        if self._trigger_at is not None and self._trigger_at >= len(self._history):
            self._trigger_at = None
            self.active = False

    def reset(self) -> None:
        self._matcher.reset()
        self._history.clear()
        self._trigger_at = None
        self.active = self._trigger is None


# xgrammar's messages start with a time and its C++ source location, and a binding error may name
# an object's address: none of it helps a client, and it tells an attacker what runs here.
_SOURCE_PREFIX = re.compile(r"^\s*(?:\[[\d:.]+\]\s*)?(?:\S+\.(?:cc|cpp|h|hpp|py):\d+:\s*)?")
_ADDRESS = re.compile(r"\s*(?:at )?0x[0-9a-fA-F]+")


def client_reason(exc: BaseException) -> str:
    """The first line of ``exc``'s message without source paths or object addresses."""
    lines = str(exc).strip().splitlines()
    reason = _ADDRESS.sub("", _SOURCE_PREFIX.sub("", lines[0])).strip() if lines else ""
    return reason or type(exc).__name__


class GrammarCompiler:
    """Compiles constraints for one tokenizer (Hugging Face ``PreTrainedTokenizerBase``)."""

    def __init__(self, tokenizer: Any, *, vocab_size: int | None = None) -> None:
        vocab = tokenizer.get_vocab()
        stop_ids = [vocab[t] for t in STOP_TOKENS if t in vocab]
        self.vocab_size = vocab_size or len(tokenizer)
        self.stop_token_ids = stop_ids
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=self.vocab_size, stop_token_ids=stop_ids
        )
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self.think_end_id: int | None = vocab.get(THINK_END)

    def compile(self, constraint: OutputConstraint) -> xgr.CompiledGrammar:
        """Compile ``constraint``; a :class:`GrammarError` names the field and the reason."""
        try:
            if constraint.kind == "json_schema":
                return self._compiler.compile_json_schema(constraint.value, any_whitespace=False)
            if constraint.kind == "regex":
                return self._compiler.compile_regex(constraint.value)
            return self._compiler.compile_grammar(constraint.value)
        except (RuntimeError, ValueError, TypeError) as exc:
            reason = client_reason(exc)
            raise GrammarError(
                f"cannot compile this {constraint.kind}: {reason}", param=constraint.param
            ) from None

    def matcher(self, constraint: OutputConstraint, *, thinking: bool) -> ConstrainedMatcher:
        """A fresh matcher; with ``thinking`` it waits for ``</think>`` before constraining."""
        return ConstrainedMatcher(
            self.compile(constraint),
            vocab_size=self.vocab_size,
            trigger_token_id=self.think_end_id if thinking else None,
            stop_token_ids=self.stop_token_ids,
        )
