"""Token counts agree with the reply they size, on the tiny GLM fixture through the gateway.

Agents size their context from ``/tokenize`` and Anthropic's ``count_tokens``: each must render the
prompt with the switches the reply renders it with (thinking off drops GLM's effort line and closes
the think block at once), whichever spelling turned thinking off.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest
from tests.fakes.harness import settings_for
from tests.fakes.scripted_engine import ServerThread
from tests.fakes.scripted_glm import ScriptedGlm

from sparkfold.api import create_app as create_gateway
from sparkfold.engines.server import create_app as create_engine
from sparkfold.engines.service import EngineService

ONE_WORD = [{"role": "user", "content": "Hello"}]


@dataclass
class Gateway:
    url: str

    def oai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=60)

    def claude(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key="unused", max_retries=0, timeout=60)

    def tokenize(self, **body: Any) -> int:
        answer = httpx.post(f"{self.url}/tokenize", json={"messages": ONE_WORD, **body}, timeout=60)
        assert answer.status_code == 200, answer.text
        return int(answer.json()["count"])


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    from sparkfold.testing.tiny_glm import write_tiny_glm

    tiny = write_tiny_glm(tmp_path_factory.mktemp("tiny-glm"))
    service = EngineService(ScriptedGlm(tiny, "Hi.<|user|>"), served_name="fake", max_tokens=16)
    with ServerThread(create_engine(service)) as engine:
        port = int(engine.url.rsplit(":", 1)[1])
        with ServerThread(create_gateway(settings_for(port))) as served:
            yield Gateway(served.url)


SWITCHES = {
    "thinking on (default)": {},
    "reasoning_effort none": {"reasoning_effort": "none"},
    "enable_thinking false": {"chat_template_kwargs": {"enable_thinking": False}},
    "thinking disabled": {"thinking": {"type": "disabled"}},
    "reasoning_effort low": {"reasoning_effort": "low"},
}


@pytest.mark.parametrize("switch", SWITCHES.values(), ids=SWITCHES.keys())
def test_tokenize_counts_the_prompt_the_reply_uses(gateway: Gateway, switch: dict[str, Any]) -> None:
    reply = gateway.oai().chat.completions.create(
        model="fake",
        messages=ONE_WORD,
        max_tokens=4,
        extra_body=switch,  # type: ignore[arg-type]
    )
    assert reply.usage is not None
    assert gateway.tokenize(**switch) == reply.usage.prompt_tokens


def test_thinking_off_counts_fewer_tokens(gateway: Gateway) -> None:
    """The switch reaches the count at all (thinking off renders a shorter prompt on GLM)."""
    assert gateway.tokenize(reasoning_effort="none") < gateway.tokenize()


ANTHROPIC_SWITCHES = {
    "thinking on (default)": {},
    "thinking disabled": {"thinking": {"type": "disabled"}},
    "thinking enabled": {"thinking": {"type": "enabled", "budget_tokens": 1024}},
    "effort low": {"output_config": {"effort": "low"}},
}


@pytest.mark.parametrize("switch", ANTHROPIC_SWITCHES.values(), ids=ANTHROPIC_SWITCHES.keys())
def test_count_tokens_counts_the_prompt_the_reply_uses(gateway: Gateway, switch: dict[str, Any]) -> None:
    claude = gateway.claude()
    reply = claude.messages.create(model="fake", max_tokens=4, messages=ONE_WORD, **switch)  # type: ignore[arg-type]
    with claude.messages.stream(model="fake", max_tokens=4, messages=ONE_WORD, **switch) as stream:  # type: ignore[arg-type]
        started = next(iter(stream))
    assert started.type == "message_start"
    counted = claude.messages.count_tokens(model="fake", messages=ONE_WORD, **switch)  # type: ignore[arg-type]
    prompt = [u.input_tokens + (u.cache_read_input_tokens or 0) for u in (reply.usage, started.message.usage)]
    assert prompt == [counted.input_tokens] * 2  # the cache's part of a prompt is read, not input


def test_a_bad_effort_is_a_400_on_the_count_too(gateway: Gateway) -> None:
    answer = httpx.post(
        f"{gateway.url}/tokenize", json={"messages": ONE_WORD, "reasoning_effort": "huge"}, timeout=60
    )
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "reasoning_effort"
