"""A DFlash2 drafter on the GPU: ``[engine.exllamav3] drafter = DIR`` with the tiny drafter of
``sparkfold.testing.tiny_dflash2`` (written here, unconverted bf16: it depends only on the tiny
target's config) in front of the decisive tiny GLM-5.3-Flash, in an engine core (the default).
Drafted greedy replies equal the ``"draft": false`` ones byte for byte, and drafts are accepted
(the drafter proposes the decisive target's next token as the first of each block); a drafted
reply's log-probabilities are the target's (the largest difference to ``"draft": false`` is recorded)."""

from __future__ import annotations

from pathlib import Path

import httpx
from gpu_engine import Results, start_engine
from test_exllamav3_engine import PROMPTS, complete, first_difference, identical, ids_of

from sparkfold.testing.tiny_glm import write_drafter


def test_dflash2_drafts_and_greedy_equals_draft_false(
    tmp_path: Path, exl3_model: Path, results: Results
) -> None:
    drafter = write_drafter(tmp_path / "dflash2")
    url, proc = start_engine(tmp_path, exl3_model, "dflash2", drafter=str(drafter))
    try:
        with httpx.Client(base_url=url, timeout=300) as client:
            replies = [
                (complete(client, p, max_tokens=48), complete(client, p, max_tokens=48, draft=False))
                for p in PROMPTS
            ]
            health = client.get("/health").json()
            scored = [
                complete(client, PROMPTS[0], max_tokens=24, logprobs=5, draft=draft)["choices"][0]["logprobs"]
                for draft in (True, False)
            ]
    finally:
        proc.stop()
    pairs = [(ids_of(a), ids_of(b)) for a, b in replies]
    results.record("dflash2_vs_plain_first_difference", [first_difference(a, b) for a, b in pairs])
    results.record("dflash2_drafted", health["drafted_total"])
    results.record("dflash2_accepted", health["accepted_total"])
    if health["drafted_total"]:
        results.record("dflash2_acceptance", round(health["accepted_total"] / health["drafted_total"], 3))
    assert health["drafted_total"] > 0 and health["accepted_total"] > 0
    identical(pairs)
    assert [a["choices"][0]["text"] for a, _ in replies] == [b["choices"][0]["text"] for _, b in replies]
    drafted, plain = scored
    results.record(
        "dflash2_logprob_max_difference",
        max(abs(a - b) for a, b in zip(drafted["token_logprobs"], plain["token_logprobs"], strict=True)),
    )
    assert drafted["tokens"] == plain["tokens"]  # log-probabilities of drafted replies: the target's
