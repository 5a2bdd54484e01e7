"""Whether an xgrammar grammar matches any finite string at all.

``root ::= root "a"`` compiles (xgrammar 0.2.9 checks the syntax, not that a derivation ends), yet
no string matches it: its matcher allows no token from the first step. Such a grammar is the
client's mistake and is refused at compile time (:func:`derives_a_string`); a dead end that is
only met later (a token the vocabulary cannot spell) ends the reply with an error instead
(:class:`~sparkfold.glm.grammar.ConstrainedMatcher`).

The check reads the grammar's own structure (``Grammar.serialize_json``: rules, and expressions
stored as ``[type, length, data…]`` in one flat array, xgrammar's ``Grammar::Impl`` in
``cpp/grammar_impl.h``) and computes the productive rules, those that derive a finite string, to
a fixed point. It errs on the safe side: an expression type it does not know, a structure it
cannot read, or a serialization version other than the one these codes were read from
(``__VERSION__``, ``"v18"`` in xgrammar 0.2.9) counts as productive (never a wrong 400; the runtime
dead end still holds).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["derives_a_string"]

# GrammarExprType in xgrammar's cpp/grammar_impl.h (the order of the enum), in this serialization
_LAYOUT = "v18"
_BYTES, _CLASS, _CLASS_STAR, _EMPTY, _RULE, _SEQUENCE, _CHOICES, _TAG_DISPATCH, _REPEAT = range(9)


def derives_a_string(grammar: Any) -> bool:
    """``False`` only when ``grammar`` (an ``xgrammar.Grammar``) surely matches no finite string."""
    try:
        data = json.loads(grammar.serialize_json())
        if data.get("__VERSION__") != _LAYOUT:
            return True
        rules = [rule[1] for rule in data["rules"]]  # [name, body expression, …]
        flat, starts = data["grammar_expr_data"], data["grammar_expr_indptr"]
        root = int(data["root_rule_id"])
        exprs = [(flat[at], flat[at + 2 : at + 2 + flat[at + 1]]) for at in starts]
    except (ValueError, KeyError, IndexError, TypeError):
        return True
    productive: set[int] = set()

    def derives(expr_id: int, depth: int = 0) -> bool:
        kind, args = exprs[expr_id]
        if depth > 1000:  # (expressions nest without cycles; this only bounds a malformed one)
            return True
        if kind == _RULE:
            return args[0] in productive
        if kind == _SEQUENCE:
            return all(derives(e, depth + 1) for e in args)
        if kind == _CHOICES:
            return any(derives(e, depth + 1) for e in args)
        if kind == _REPEAT:  # [rule, min, max]
            return args[1] == 0 or args[0] in productive
        return True  # bytes, a character class, its star, "", a tag dispatch, what is not known here

    try:
        changed = True
        while changed:
            changed = False
            for rule, body in enumerate(rules):
                if rule not in productive and derives(body):
                    productive.add(rule)
                    changed = True
    except (IndexError, TypeError):
        return True
    return root in productive
