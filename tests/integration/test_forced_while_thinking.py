"""A forced reply (``tool_choice`` required or named, ``response_format``) with thinking on, on the real
tiny GLM-5.3 model (random weights, sampled) through the engine server.

The grammar waits for ``</think>``; the end-of-turn tokens used to be free inside the reasoning, so
the tiny model stopped there (seed 1: ``finish_reason: "stop"`` after 78 tokens of reasoning, no
call). Now a constrained reply either reaches what it was forced to write or is cut by
``max_tokens`` (``length``); ``thinking_budget`` closes the reasoning early, and the call follows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from test_forced_calls import PICK
from tests.fakes.scripted_engine import ServerThread

from sparkfold.config import EngineSettings
from sparkfold.engines.server import create_app as create_engine
from sparkfold.engines.service import EngineService
from sparkfold.testing import torch_threads

pytestmark = pytest.mark.slow

BUDGET = 96
SEEDS = range(6)
FORCED: list[dict[str, Any]] = [
    {"tools": [{"type": "function", "function": PICK}], "tool_choice": "required"},
    {
        "tools": [{"type": "function", "function": PICK}],
        "tool_choice": {"type": "function", "function": {"name": "pick"}},
    },
    {"response_format": {"type": "json_object"}},
]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from sparkfold.engines.transformers.backend import load
    from sparkfold.testing.tiny_glm import write_tiny_glm

    model = write_tiny_glm(tmp_path_factory.mktemp("tiny-glm"))
    settings = EngineSettings(model=str(model), context=2048, max_tokens=BUDGET, parallel=1)
    with torch_threads(1):
        generator = load(settings).generator
        assert generator is not None
        service = EngineService(generator, served_name="glm", max_tokens=BUDGET)  # thinking on
        with ServerThread(create_engine(service)) as engine:
            yield engine.url
        generator.close()


def chat(url: str, **body: Any) -> dict[str, Any]:
    body = {"model": "glm", "messages": [{"role": "user", "content": "Pick a color"}], **body}
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    choice: dict[str, Any] = reply.json()["choices"][0]
    return choice


def honoured(choice: dict[str, Any], forced: dict[str, Any]) -> bool:
    """What the reply wrote after its reasoning is what it was forced to write (complete unless cut)."""
    message, cut = choice["message"], choice["finish_reason"] == "length"
    if "tools" in forced:
        names = [c["function"]["name"] for c in message.get("tool_calls") or []]
        done = cut or choice["finish_reason"] == "tool_calls"
        return done and bool(names) and set(names) == {"pick"} and not message.get("content")
    text = message.get("content") or ""
    return text.startswith("{") and (
        cut or (choice["finish_reason"] == "stop" and isinstance(json.loads(text), dict))
    )


@pytest.mark.parametrize("forced", FORCED, ids=["required", "named", "json_object"])
def test_a_forced_reply_never_ends_its_turn_inside_its_reasoning(url: str, forced: dict[str, Any]) -> None:
    for seed in SEEDS:
        choice = chat(url, seed=seed, max_tokens=BUDGET, **forced)
        assert choice["finish_reason"] == "length" or honoured(choice, forced), (seed, choice)


@pytest.mark.parametrize("forced", FORCED, ids=["required", "named", "json_object"])
def test_once_the_reasoning_closes_the_forced_part_follows(url: str, forced: dict[str, Any]) -> None:
    for seed in SEEDS[:3]:
        choice = chat(url, seed=seed, max_tokens=BUDGET, thinking_budget=8, **forced)
        assert choice["message"].get("reasoning_content"), (seed, choice)
        assert honoured(choice, forced), (seed, choice)


def test_a_forced_reply_cut_by_max_tokens_ends_with_length(url: str) -> None:
    choice = chat(url, seed=1, max_tokens=12, **FORCED[0])
    assert choice["finish_reason"] == "length" and not choice["message"].get("tool_calls")
