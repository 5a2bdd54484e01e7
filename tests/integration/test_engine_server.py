"""The transformers engine server for real (tp = 1), through the official openai SDK."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from engine_procs import alone_and_together, free_port, reference_tokens, serving, write_config

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(smol_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    tmp = tmp_path_factory.mktemp("engine")
    with serving(write_config(tmp / "sparkfold.toml", smol_dir, port=port), tmp / "engine.log", port) as url:
        yield url


@pytest.fixture
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def test_chat_through_the_openai_sdk(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model="smol", messages=QUESTION, temperature=0, max_tokens=24)
    assert "Paris" in (answer.choices[0].message.content or "")
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None and answer.usage.completion_tokens > 0


def test_streamed_chat_through_the_openai_sdk(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="smol",
        messages=QUESTION,
        temperature=0,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_greedy_equals_plain_generate(server: str, smol_dir: Path) -> None:
    prompt = httpx.post(f"{server}/tokenize", json={"messages": QUESTION}).json()["tokens"]
    body = {"prompt": prompt, "max_tokens": 20, "temperature": 0, "return_token_ids": True}
    served = httpx.post(f"{server}/v1/completions", json=body, timeout=120).json()["choices"][0]["token_ids"]
    assert served == reference_tokens(smol_dir, prompt, 20)


def test_bad_input_is_4xx_naming_the_field_and_the_server_keeps_serving(
    client: openai.OpenAI, server: str
) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="smol", messages=QUESTION, max_tokens=-5)
    assert "max_tokens" in str(bad.value)
    with pytest.raises(openai.BadRequestError) as long:
        client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "hi " * 3000}])
    assert long.value.code == "context_length_exceeded"
    raw = httpx.post(f"{server}/v1/chat/completions", content=b'{"messages": [', timeout=30)
    assert raw.status_code == 400
    wrong = httpx.post(f"{server}/v1/chat/completions", json={"messages": QUESTION, "top_p": "x"}, timeout=30)
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "top_p"
    answer = client.chat.completions.create(model="smol", messages=QUESTION, temperature=0, max_tokens=12)
    assert "Paris" in (answer.choices[0].message.content or "")


def test_concurrent_requests_get_what_they_get_alone(server: str) -> None:
    prompts = ["The capital of France is", "One, two, three,"]

    alone, together = alone_and_together(server, prompts)
    assert alone == together


def test_a_client_that_leaves_mid_stream_cancels_its_generation(server: str) -> None:
    before = httpx.get(f"{server}/health").json()["requests_total"]
    body = {"prompt": "Count from one to one hundred:", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=60) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: "):
                break  # first token arrived; leave
    health: dict[str, int] = {}
    for _ in range(300):  # bounded poll: the engine notices the disconnect and stops
        health = httpx.get(f"{server}/health").json()
        if health["requests_total"] > before and health["requests_running"] == 0:
            break
        time.sleep(0.1)
    assert health["requests_running"] == 0 and health["requests_total"] == before + 1
    metrics = httpx.get(f"{server}/metrics").text
    assert 'tensorfold:requests_total{finish_reason="abort"} 1.0' in metrics


def test_the_conformance_suite_passes(server: str) -> None:
    from sparkfold.conformance import run

    failed = [f"{r.name}: {r.detail}" for r in run(server) if not r.passed]
    assert not failed


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_grammar_no_finite_string_matches_is_a_400(client: openai.OpenAI, temperature: float) -> None:
    # main: 502 "probability tensor contains either inf, nan or element < 0" (sampled), or a 200
    # whose content was <|endoftext|> three times (greedy)
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(
            model="smol",
            messages=QUESTION,
            temperature=temperature,
            max_tokens=3,
            extra_body={"guided_grammar": 'root ::= root "a"'},
        )
    body = error.value.body
    assert isinstance(body, dict) and body["param"] == "guided_grammar"
    assert body["message"].startswith("no finite string matches this grammar")


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        ({"guided_grammar": 'root ::= "The answer is " ("yes" | "no") "."'}, r"The answer is (yes|no)\."),
        ({"guided_regex": "[A-Z][a-z]{2,8}"}, r"[A-Z][a-z]{2,8}"),
        ({"guided_choice": ["Paris", "Lyon", "Nice"]}, r"Paris|Lyon|Nice"),
        (
            {
                "guided_json": {
                    "type": "object",
                    "properties": {"c": {"type": "string", "maxLength": 12}},
                    "required": ["c"],
                }
            },
            r'\{"c": ?"[^"]{0,12}"\}',
        ),
    ],
)
def test_at_temperature_0_the_content_matches_the_constraint(
    client: openai.OpenAI, extra: dict[str, object], pattern: str
) -> None:
    import re

    answer = client.chat.completions.create(
        model="smol", messages=QUESTION, temperature=0, max_tokens=48, extra_body=extra
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "stop" and re.fullmatch(pattern, choice.message.content or ""), choice
