"""The transformers engine server on the tiny GLM-5.3-Flash, for real, through the openai SDK."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator

import jsonschema
import openai
import pytest
from engine_procs import free_port, serving, write_config
from PIL import Image

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Answer in JSON."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from sparkfold.testing.tiny_glm import write_tiny_glm

    tmp = tmp_path_factory.mktemp("glm-engine")
    model = write_tiny_glm(tmp / "model")
    port = free_port()
    config = write_config(tmp / "sparkfold.toml", model, port=port, served_name="glm", thinking=False)
    with serving(config, tmp / "engine.log", port) as url:
        yield url


@pytest.fixture
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def test_json_schema_output_validates(client: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    for seed in range(3):
        answer = client.chat.completions.create(
            model="glm",
            messages=ASK,
            response_format=fmt,
            seed=seed,
            temperature=1.0,
            max_tokens=48,  # type: ignore[arg-type]
        )
        assert answer.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(answer.choices[0].message.content or ""), SCHEMA)


def test_streamed_guided_choice(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="glm",
        messages=ASK,
        stream=True,
        max_tokens=16,
        extra_body={"guided_choice": ["yes", "no"]},  # type: ignore[arg-type]
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text in ("yes", "no")


def test_a_picture_goes_through_the_vision_tower(client: openai.OpenAI) -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (0, 128, 255)).save(buffer, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
    answer = client.chat.completions.create(model="glm", messages=messages, max_tokens=4)  # type: ignore[arg-type]
    assert answer.usage is not None and answer.usage.prompt_tokens > 16  # the picture's tokens count
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(
            model="glm",
            messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x"}}]}
            ],  # type: ignore[list-item]
        )
    assert "data: URL" in error.value.message
