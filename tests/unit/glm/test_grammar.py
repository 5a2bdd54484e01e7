"""Structured outputs: request constraints, compile errors, the matcher's think-block gate."""

from __future__ import annotations

import json
import pickle
from types import SimpleNamespace
from typing import Any

import pytest
from tests.fakes.small_vocab import SIZE, STOP, small_matcher

from sparkfold.glm.errors import GrammarDeadEnd, GrammarError
from sparkfold.glm.grammar import (
    GrammarCompiler,
    OutputConstraint,
    allocate_bitmask,
    apply_bitmask,
    constraint_from_request,
)

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}


def request(**fields: Any) -> SimpleNamespace:
    base = {
        k: None
        for k in (
            "response_format",
            "guided_json",
            "guided_regex",
            "guided_choice",
            "guided_grammar",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
        )
    }
    return SimpleNamespace(**(base | fields))


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer)


def test_request_fields_become_constraints() -> None:
    assert constraint_from_request(request()) is None
    assert constraint_from_request(request(response_format={"type": "text"})) is None
    c = constraint_from_request(
        request(response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}})
    )
    assert c is not None and c.kind == "json_schema" and json.loads(c.value) == SCHEMA
    obj = constraint_from_request(request(response_format={"type": "json_object"}))
    assert obj is not None and json.loads(obj.value) == {"type": "object"}
    assert constraint_from_request(request(guided_json=json.dumps(SCHEMA))).param == "guided_json"  # type: ignore[union-attr]
    assert constraint_from_request(request(guided_regex="[ab]+")).kind == "regex"  # type: ignore[union-attr]
    choice = constraint_from_request(request(guided_choice=["yes", 'no "way"']))
    assert choice is not None and choice.value == 'root ::= "yes" | "no \\"way\\""'


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ],
)
def test_bad_requests_name_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(GrammarError) as error:
        constraint_from_request(request(**fields))
    assert error.value.param == param and error.value.status == 400


@pytest.mark.parametrize(
    "constraint",
    [
        OutputConstraint(
            "json_schema", json.dumps({"type": "frobnicate"}), "response_format.json_schema.schema"
        ),
        OutputConstraint("regex", "(unclosed", "guided_regex"),
        OutputConstraint("grammar", "root ::= undefined_rule", "guided_grammar"),
    ],
)
def test_uncompilable_constraints_are_grammar_errors(
    compiler: GrammarCompiler, constraint: OutputConstraint
) -> None:
    with pytest.raises(GrammarError) as error:
        compiler.compile(constraint)
    assert error.value.param == constraint.param
    assert f"cannot compile this {constraint.kind}" in error.value.message
    message = error.value.message
    assert "/project" not in message and ".cc:" not in message and "0x" not in message, message


def _allowed(compiler: GrammarCompiler, matcher: Any) -> set[int]:
    import torch

    mask = allocate_bitmask(compiler.vocab_size)
    logits = torch.zeros(1, compiler.vocab_size)
    if matcher.fill_bitmask(mask, 0):
        apply_bitmask(logits, mask)
    return {i for i in range(compiler.vocab_size) if logits[0, i] == 0}


def test_matcher_waits_for_the_think_block_to_close(compiler: GrammarCompiler, tokenizer: Any) -> None:
    constraint = constraint_from_request(request(guided_choice=["yes", "no"]))
    assert constraint is not None
    matcher = compiler.matcher(constraint, thinking=True)
    think_end = tokenizer.convert_tokens_to_ids("</think>")
    stops = set(compiler.stop_token_ids)
    assert len(stops) == 4
    reasoning = set(range(compiler.vocab_size)) - stops
    assert _allowed(compiler, matcher) == reasoning  # never blocks reasoning or </think>; ends no turn
    for token in tokenizer.encode("maybe", add_special_tokens=False):
        assert matcher.accept_token(token)
        assert _allowed(compiler, matcher) == reasoning
    assert matcher.accept_token(think_end) and matcher.active
    allowed = _allowed(compiler, matcher)
    assert think_end not in allowed
    texts = {tokenizer.decode([t]) for t in allowed}
    assert texts and all("yes".startswith(t) or "no".startswith(t) for t in texts)
    for token in tokenizer.encode("no", add_special_tokens=False):
        assert matcher.accept_token(token)
    assert not matcher.is_terminated()
    assert matcher.accept_token(tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    assert matcher.is_terminated()


def test_matcher_rejects_tokens_outside_the_grammar_and_rolls_back(
    compiler: GrammarCompiler, tokenizer: Any
) -> None:
    constraint = constraint_from_request(request(guided_regex="[0-9]{2}"))
    assert constraint is not None
    matcher = compiler.matcher(constraint, thinking=True)
    think_end = tokenizer.convert_tokens_to_ids("</think>")
    digit = tokenizer.convert_tokens_to_ids("7")
    assert matcher.accept_token(think_end) and matcher.accept_token(digit)
    assert not matcher.accept_token(tokenizer.convert_tokens_to_ids("a"))
    assert matcher.accept_token(digit)
    matcher.rollback(1)
    assert matcher.active and not matcher.is_terminated()
    matcher.rollback(2)
    assert not matcher.active  # the </think> was undone: the gate is closed again
    assert _allowed(compiler, matcher) == set(range(compiler.vocab_size)) - set(compiler.stop_token_ids)
    matcher.reset()
    thinking_off = compiler.matcher(constraint, thinking=False)
    assert thinking_off.active and digit in _allowed(compiler, thinking_off)


def _walk(compiler: GrammarCompiler, matcher: Any, seed: int, steps: int = 120) -> list[int]:
    """A reply drawn uniformly from what the grammar allows at each step, until it is done."""
    import random

    rng, ids = random.Random(seed), []
    stops = set(compiler.stop_token_ids)
    for _ in range(steps):
        allowed = sorted(_allowed(compiler, matcher))
        token = rng.choice(allowed)
        assert matcher.accept_token(token)
        if token in stops:
            break
        ids.append(token)
    return ids


BOUNDED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "tags": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 4}, "maxItems": 2},
    },
    "required": ["name", "tags"],
}


@pytest.mark.parametrize("seed", range(12))
def test_json_strings_never_hold_control_characters_or_special_tokens(
    compiler: GrammarCompiler, tokenizer: Any, seed: int
) -> None:
    constraint = OutputConstraint("json_schema", json.dumps(BOUNDED), "response_format")
    matcher = compiler.matcher(constraint, thinking=False)
    ids = _walk(compiler, matcher, seed)
    assert matcher.is_terminated()
    special = set(tokenizer.all_special_ids)
    assert not special & set(ids), tokenizer.convert_ids_to_tokens(ids)
    reply = json.loads(tokenizer.decode(ids), strict=True)  # strict: no raw control characters
    assert set(reply) == {"name", "tags"}


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 6},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, {"get_weather"}),
        ({"tool_choice": "required"}, {"get_weather", "get_time"}),
        ({"tool_choice": "required", "parallel_tool_calls": False}, {"get_weather", "get_time"}),
    ],
)
def test_a_forced_tool_call_is_written_in_glm_format(
    compiler: GrammarCompiler, tokenizer: Any, fields: dict[str, Any], names: set[str]
) -> None:
    from sparkfold.glm.parser import parse_output

    tools = [WEATHER, CLOCK]
    constraint = constraint_from_request(request(tools=tools, **fields), "glm_4_7")
    assert constraint is not None and constraint.kind == "structural_tag"
    for seed in range(4):
        matcher = compiler.matcher(constraint, thinking=False)
        ids = _walk(compiler, matcher, seed, steps=200)
        reply = parse_output(tokenizer.decode(ids), tools, thinking=False)
        assert reply.tool_calls, tokenizer.decode(ids)
        assert {c.name for c in reply.tool_calls} <= names
        if fields.get("parallel_tool_calls") is False or "function" in str(fields["tool_choice"]):
            assert len(reply.tool_calls) == 1
        for call in reply.tool_calls:
            if call.name == "get_weather":
                args = json.loads(call.arguments)
                assert set(args) == {"city", "days"} and 1 <= args["days"] <= 7


def test_forced_parallel_calls_are_calls_alone(compiler: GrammarCompiler, tokenizer: Any) -> None:
    """``required`` with parallel calls: another call or the end may follow a call, never text."""
    constraint = constraint_from_request(request(tools=[WEATHER, CLOCK], tool_choice="required"), "glm_4_7")
    assert constraint is not None
    matcher = compiler.matcher(constraint, thinking=False)
    call = "<tool_call>get_time</tool_call>"
    assert all(matcher.accept_token(t) for t in tokenizer.encode(call * 2, add_special_tokens=False))
    assert not matcher.accept_token(tokenizer.encode("Done", add_special_tokens=False)[0])
    assert matcher.accept_token(tokenizer.convert_tokens_to_ids("<|observation|>"))


def test_tool_choice_auto_and_none_leave_the_reply_free() -> None:
    assert constraint_from_request(request(tools=[WEATHER], tool_choice="auto"), "glm_4_7") is None
    assert constraint_from_request(request(tools=[WEATHER], tool_choice=None), "glm_4_7") is None
    assert (
        constraint_from_request(
            request(tools=[WEATHER], tool_choice="none", parallel_tool_calls=False), "glm_4_7"
        )
        is None
    )


def test_forcing_a_tool_that_was_not_offered_names_tool_choice() -> None:
    with pytest.raises(GrammarError) as error:
        constraint_from_request(
            request(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
            "glm_4_7",
        )
    assert error.value.param == "tool_choice"


RECURSIVE_REQUIRED = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}


def test_a_serialization_of_another_xgrammar_layout_is_never_judged_unproductive() -> None:
    """The expression codes are read from xgrammar's v18 serialization; another version may
    number them otherwise, so the check then errs towards productive (no wrong 400)."""
    import xgrammar

    from sparkfold.glm.finite import derives_a_string

    grammar = xgrammar.Grammar.from_ebnf('root ::= root "a"')
    assert derives_a_string(grammar) is False
    data = json.loads(grammar.serialize_json())

    class Other:
        def serialize_json(self) -> str:
            return json.dumps({**data, "__VERSION__": "v99"})

    assert derives_a_string(Other()) is True


@pytest.mark.parametrize(
    "constraint",
    [
        OutputConstraint("grammar", 'root ::= root "a"', "guided_grammar"),
        OutputConstraint("grammar", 'root ::= "a" root', "guided_grammar"),
        OutputConstraint("grammar", 'root ::= "x" b\nb ::= "c" b | b "d"', "guided_grammar"),
        OutputConstraint("grammar", 'root ::= b{2,3}\nb ::= "x" b', "guided_grammar"),
        OutputConstraint("json_schema", json.dumps(RECURSIVE_REQUIRED), "response_format.json_schema.schema"),
    ],
)
def test_a_constraint_no_finite_string_matches_is_a_grammar_error(
    compiler: GrammarCompiler, constraint: OutputConstraint
) -> None:
    with pytest.raises(GrammarError) as error:
        compiler.compile(constraint)
    assert error.value.param == constraint.param and error.value.status == 400
    assert error.value.message.startswith(f"no finite string matches this {constraint.kind}")


@pytest.mark.parametrize(
    "ebnf",
    [
        'root ::= "x" b | "y"\nb ::= b "c"',  # b is dead, but root has a way out
        'root ::= "(" root ")" | ""',
        'root ::= b{0,3}\nb ::= "x" b',
        'root ::= [a-z]* | "q"',
        'root ::= a\na ::= b | "q"\nb ::= a',
    ],
)
def test_recursive_grammars_with_a_way_out_compile(compiler: GrammarCompiler, ebnf: str) -> None:
    compiler.compile(OutputConstraint("grammar", ebnf, "guided_grammar"))


def test_a_dead_end_offers_the_stops_only_and_is_reported() -> None:
    import torch

    matcher = small_matcher('root ::= "A" "!"')  # nothing in the vocabulary spells "!"
    mask = allocate_bitmask(SIZE)
    matcher.fill_bitmask(mask, 0)
    assert matcher.dead_end is None
    assert matcher.accept_token(0)  # "A"
    mask = allocate_bitmask(SIZE)
    assert matcher.fill_bitmask(mask, 0)
    logits = torch.zeros(1, SIZE)
    apply_bitmask(logits, mask)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [STOP]  # never an all -inf row
    assert isinstance(matcher.dead_end, GrammarDeadEnd) and matcher.dead_end.param == "guided_grammar"
    assert pickle.loads(pickle.dumps(matcher.dead_end)).param == "guided_grammar"  # (engine core)
    matcher.rollback(1)  # (a drafted token undone: judged again)
    assert matcher.dead_end is None


TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
    },
}
TIME_CALL = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'


@pytest.mark.parametrize(
    ("parallel", "accepted", "refused"),
    [
        (None, [TIME_CALL, TIME_CALL + TIME_CALL], ["Hi", "Hi " + TIME_CALL, TIME_CALL + "\n\nbye"]),
        (False, [TIME_CALL], ["Hi", TIME_CALL + TIME_CALL, TIME_CALL + "\n\nbye"]),
    ],
    ids=["parallel", "one call"],
)
def test_forced_calls_in_the_template_format_are_the_whole_reply(
    parallel: bool | None, accepted: list[str], refused: list[str]
) -> None:
    """``required`` in the demo model's ``<tool_call>`` JSON form: calls and nothing else (xgrammar's
    own "one or more calls" lets text follow them, which a small model writes until max_tokens)."""
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    forced = request(tools=[TIME_TOOL], tool_choice="required", parallel_tool_calls=parallel)
    constraint = constraint_from_request(forced, "qwen_3")
    assert constraint is not None and constraint.kind == "structural_tag"
    grammar = xgr.Grammar.from_structural_tag(constraint.value)
    assert all(_is_grammar_accept_string(grammar, text) for text in accepted)
    assert not any(_is_grammar_accept_string(grammar, text) for text in refused)
