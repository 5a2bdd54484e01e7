"""A 64-token vocabulary for grammar tests that need a token the grammar wants and no token spells.

Token ``i < 26`` spells ``A``…``Z``, ``26 <= i < 52`` spells ``a``…``z``, ``52 <= i < 62`` the digits,
``62`` a space and ``63`` is the stop token. Nothing spells ``!``: ``root ::= "A" "!"`` compiles (a
finite string matches it) and dead-ends after ``A``.
"""

from __future__ import annotations

import string

import xgrammar as xgr

from sparkfold.glm.grammar import ConstrainedMatcher, MatcherSpec, OutputConstraint

VOCAB = [*string.ascii_uppercase, *string.ascii_lowercase, *string.digits, " ", "</s>"]
STOP = len(VOCAB) - 1
SIZE = len(VOCAB)


def small_matcher(ebnf: str) -> ConstrainedMatcher:
    """A matcher for ``ebnf`` over :data:`VOCAB` (active from the first token)."""
    info = xgr.TokenizerInfo(VOCAB, xgr.VocabType.RAW, vocab_size=SIZE, stop_token_ids=[STOP])
    compiled = xgr.GrammarCompiler(info, max_threads=1).compile_grammar(ebnf)
    spec = MatcherSpec(OutputConstraint("grammar", ebnf, "guided_grammar"), SIZE, (STOP,), None)
    return ConstrainedMatcher(
        compiled, vocab_size=SIZE, trigger_token_id=None, stop_token_ids=(STOP,), spec=spec
    )
