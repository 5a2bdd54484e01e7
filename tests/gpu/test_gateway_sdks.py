"""The gateway's SDK tests in front of the exllamav3 engine.

The tests of ``tests/integration/test_gateway_real_engine.py`` (the official openai and
anthropic SDKs against ``sparkfold api``, streaming and not) run here unchanged, with the
exllamav3 engine on the GPU behind the gateway instead of the CPU engine; it serves the decisive
tiny GLM-5.3-Flash under the name those tests use. Not repeated: the mid-stream disconnect test,
whose 24-token reply is over on a GPU before the client can look at the lane. Added here:
``logprobs`` / ``top_logprobs``, which the gateway passes to this engine (its card says it has them).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from gpu_engine import start_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))  # its `engine_procs` import
from tests.integration.test_gateway_real_engine import (
    claude,
    gateway_url,
    oai,
    test_chat,
    test_chat_stream,
    test_completions,
    test_count_tokens,
    test_greedy_stream_equals_greedy_reply,
    test_messages,
    test_messages_stream,
    test_models_and_health,
    test_responses,
)

__all__ = [
    "claude",
    "gateway_url",
    "oai",
    "test_chat",
    "test_chat_stream",
    "test_completions",
    "test_count_tokens",
    "test_greedy_stream_equals_greedy_reply",
    "test_messages",
    "test_messages_stream",
    "test_models_and_health",
    "test_responses",
]


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory, exl3_model: Path) -> Iterator[str]:
    """The exllamav3 engine, named as the SDK tests expect (``smol``), two lanes like the gateway."""
    url, proc = start_engine(
        tmp_path_factory.mktemp("sdk"), exl3_model, "sdk", served_name="smol", parallel=2
    )
    try:
        yield url
    finally:
        proc.stop()


def test_logprobs_through_the_gateway(oai: openai.OpenAI) -> None:
    """Per token a log-probability <= 0 and five alternatives summing to <= 1, streamed as not."""
    ask = [{"role": "user", "content": "Name the colours of the rainbow"}]
    common: dict[str, Any] = {"model": "smol", "messages": ask, "max_tokens": 8, "temperature": 0}
    reply = oai.chat.completions.create(**common, logprobs=True, top_logprobs=5)
    content = reply.choices[0].logprobs.content if reply.choices[0].logprobs else None
    assert content and reply.usage is not None
    used = reply.usage.completion_tokens
    assert used - 1 <= len(content) <= used  # the token that ends a reply has no entry
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 5
        assert sum(math.exp(t.logprob) for t in entry.top_logprobs) <= 1 + 1e-4
    chunks = list(oai.chat.completions.create(**common, logprobs=True, top_logprobs=5, stream=True))
    streamed = [
        e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []
    ]
    assert [(e.token, [t.token for t in e.top_logprobs]) for e in streamed] == [
        (e.token, [t.token for t in e.top_logprobs]) for e in content
    ]
    assert all(
        math.isclose(a.logprob, b.logprob, abs_tol=1e-4) for a, b in zip(streamed, content, strict=True)
    )
    scored = oai.completions.create(
        model="smol", prompt="The history of the river", max_tokens=4, logprobs=5, temperature=0
    )
    columns = scored.choices[0].logprobs
    assert columns is not None and columns.token_logprobs and all(lp <= 0 for lp in columns.token_logprobs)
