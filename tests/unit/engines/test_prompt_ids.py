"""A re-sent long prompt is not tokenized again (``sparkfold.engines.prompt_ids``)."""

from __future__ import annotations

from fastapi.testclient import TestClient
from tests.fakes.fake_engine import FakeGenerator

from sparkfold.engines.prompt_ids import PromptIds
from sparkfold.engines.server import create_app
from sparkfold.engines.service import EngineService


class Counting:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        self.calls.append(text)
        return [len(word) for word in text.split()] + ([1] if add_special_tokens else [])


def test_a_long_prompt_is_tokenized_once_a_short_one_every_time() -> None:
    encode = Counting()
    ids = PromptIds(encode, min_chars=100)
    long = "word " * 100
    assert ids(long) == ids(long) == encode(long)
    assert ids(long, add_special_tokens=True) == [4] * 100 + [1]  # another key
    ids("short")
    ids("short")
    assert encode.calls.count(long) == 3 and encode.calls.count("short") == 2 and ids.hits == 1


def test_the_kept_ids_stay_within_max_tokens_least_recent_out() -> None:
    encode = Counting()
    ids = PromptIds(encode, min_chars=10, max_tokens=250)
    texts = [f"{n} " + "ab " * 99 for n in range(3)]  # 100 tokens each
    for text in texts:
        ids(text)
    ids(texts[0])  # the oldest went out when the third came in
    ids(texts[2])
    assert [encode.calls.count(t) for t in texts] == [2, 1, 1]


def test_the_engine_server_tokenizes_a_resent_long_prompt_once() -> None:
    generator = FakeGenerator(context_length=65_536)
    calls: list[str] = []
    encode = generator.encode

    def counted(text: str, *, add_special_tokens: bool = False) -> list[int]:
        calls.append(text)
        return encode(text, add_special_tokens=add_special_tokens)

    generator.encode = counted  # type: ignore[method-assign]
    client = TestClient(create_app(EngineService(generator, served_name="fake", max_tokens=8)))
    prompt = "the same long context " * 1_000
    replies = [
        client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4}).json() for _ in range(2)
    ]
    assert replies[0]["usage"] == replies[1]["usage"]
    assert calls.count(prompt) == 1
