"""The gateway's SDK tests in front of the exllamav3 engine.

The tests of ``tests/integration/test_gateway_real_engine.py`` (the official openai and
anthropic SDKs against ``sparkfold api``, streaming and not) run here unchanged, with the
exllamav3 engine on the GPU behind the gateway instead of the CPU engine; it serves the decisive
tiny GLM-5.3-Flash under the name those tests use. Not repeated: the mid-stream disconnect test,
whose 24-token reply is over on a GPU before the client can look at the lane.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

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
