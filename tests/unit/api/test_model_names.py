"""``[api] model_aliases``: the names coding agents ask for, answered by the served model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest
from tests.fakes.harness import Running
from tests.fakes.scripted_engine import ScriptedEngine

from sparkfold.api.model_names import ModelNames
from sparkfold.config import ApiSettings

ALIASES = ["claude-*", "gpt-*", "codex-*"]
ASK: Any = [{"role": "user", "content": "hi"}]


@pytest.fixture
def aliased(start_gateway: Callable[..., Running]) -> Running:
    return start_gateway(model_aliases=ALIASES)


def test_every_generating_route_sends_the_served_name(aliased: Running, fake: ScriptedEngine) -> None:
    oai = openai.OpenAI(base_url=aliased.url + "/v1", api_key="unused", max_retries=0)
    claude = anthropic.Anthropic(base_url=aliased.url, api_key="unused", max_retries=0)
    oai.chat.completions.create(model="gpt-5.5", messages=ASK)
    oai.completions.create(model="codex-mini", prompt="hi")
    oai.responses.create(model="gpt-5.5-codex", input="hi")
    reply = claude.messages.create(model="claude-haiku-4-5", max_tokens=8, messages=ASK)
    aliased.http.post("/tokenize", json={"model": "claude-opus-5-5", "prompt": "hi"}).raise_for_status()
    assert [body.get("model") for body in fake.requests[-5:]] == ["fake"] * 5
    assert reply.model == "claude-haiku-4-5"  # named as asked


def test_a_name_no_alias_matches_goes_to_the_engine_unchanged(aliased: Running, fake: ScriptedEngine) -> None:
    """The engine answers it (ours: a 404 naming the served model)."""
    aliased.http.post("/v1/chat/completions", json={"model": "llama-3", "messages": ASK})
    aliased.http.post("/v1/chat/completions", json={"model": "Claude-opus", "messages": ASK})  # case counts
    assert [body["model"] for body in fake.requests[-2:]] == ["llama-3", "Claude-opus"]


def test_the_model_list_names_what_answers(aliased: Running) -> None:
    listed = aliased.http.get("/v1/models").json()["data"]
    assert [card["id"] for card in listed] == ["fake", *ALIASES]
    page = aliased.http.get("/v1/models", headers={"anthropic-version": "2023-06-01"}).json()
    assert [info["id"] for info in page["data"]] == ["fake", *ALIASES] and page["last_id"] == "codex-*"
    assert aliased.http.get("/v1/models/claude-opus-5-5").json()["id"] == "claude-opus-5-5"
    assert aliased.http.get("/v1/models/llama-3").status_code == 404


def test_without_aliases_only_the_served_name_is_listed(gateway: Running, fake: ScriptedEngine) -> None:
    assert [card["id"] for card in gateway.http.get("/v1/models").json()["data"]] == ["fake"]
    gateway.http.post("/v1/chat/completions", json={"model": "claude-opus-5-5", "messages": ASK})
    assert fake.requests[-1]["model"] == "claude-opus-5-5"
    assert ApiSettings().model_aliases == []


def test_patterns_are_globs() -> None:
    names = ModelNames("GLM", ["claude-*", "o[34]-mini", "gpt-5?"])
    assert [names.engine_name(n) for n in ("claude-x", "o3-mini", "o5-mini", "gpt-55", "gpt-5", None)] == [
        "GLM",
        "GLM",
        "o5-mini",
        "GLM",
        "gpt-5",
        None,
    ]
