"""GLM checkpoints through the engine server: prompts, reasoning, tool calls, grammar, pictures.

A scripted generator with the tiny GLM tokenizer plays the model, so the replies are exactly
what a test needs; the official openai SDK talks to the app in-process.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient
from PIL import Image
from tests.fakes.fake_engine import FakeGenerator
from tests.fakes.scripted_glm import ASK, CALL, TOOLS, ScriptedGlm

from sparkfold.engines.server import create_app
from sparkfold.engines.service import EngineService

PNG_BYTES = io.BytesIO()
Image.new("RGB", (1, 1), (0, 0, 255)).save(PNG_BYTES, "PNG")
PNG = "data:image/png;base64," + base64.b64encode(PNG_BYTES.getvalue()).decode()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sparkfold.testing.tiny_glm import write_tiny_glm

    return write_tiny_glm(tmp_path_factory.mktemp("tiny-glm"))


def sdk(generator: Any) -> openai.OpenAI:
    service = EngineService(generator, served_name="glm", max_tokens=256)
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key="x", http_client=TestClient(create_app(service))
    )


def test_streamed_tool_call_and_reasoning_through_the_openai_sdk(tiny: Path) -> None:
    generator = ScriptedGlm(tiny, CALL)
    stream = sdk(generator).chat.completions.create(model="glm", messages=ASK, tools=TOOLS, stream=True)  # type: ignore[arg-type]
    chunks = [c for c in stream if c.choices]
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks)
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    calls = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
    assert (reasoning, content) == ("Let me check the weather.", "Sure.")
    assert calls[0].index == 0 and calls[0].id and calls[0].type == "function"
    assert calls[0].function is not None and calls[0].function.name == "get_weather"
    assert len(calls) > 2 and all(
        c.index == 0 and c.id is None and c.function.name is None for c in calls[1:]
    )  # type: ignore[union-attr]
    arguments = "".join(c.function.arguments or "" for c in calls)  # type: ignore[union-attr]
    assert json.loads(arguments) == {"city": "Paris", "days": 2}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    prompt = generator.decode(generator.seen[0][0])
    assert prompt.startswith("[gMASK]<sop><|system|>Reasoning Effort: Max<|system|>\n# Tools")
    assert prompt.endswith("<|user|>Weather in Paris?<|assistant|><think>")


def test_tool_call_in_one_response(tiny: Path) -> None:
    answer = sdk(ScriptedGlm(tiny, CALL)).chat.completions.create(model="glm", messages=ASK, tools=TOOLS)  # type: ignore[arg-type]
    message = answer.choices[0].message
    assert answer.choices[0].finish_reason == "tool_calls"
    assert (message.model_extra or {}).get("reasoning_content") == "Let me check the weather."
    assert message.tool_calls and json.loads(message.tool_calls[0].function.arguments) == {
        "city": "Paris",
        "days": 2,
    }  # type: ignore[union-attr]


def test_a_call_cut_off_by_max_tokens_comes_back_partial(tiny: Path) -> None:
    generator = ScriptedGlm(tiny, CALL)
    cut = len(generator.encode(CALL)) - 6
    answer = sdk(generator).chat.completions.create(model="glm", messages=ASK, tools=TOOLS, max_tokens=cut)  # type: ignore[arg-type]
    assert answer.choices[0].finish_reason == "length"
    (call,) = answer.choices[0].message.tool_calls or []
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "Paris"')  # type: ignore[union-attr]


def test_structured_output_reaches_the_generator_and_bad_ones_are_400(tiny: Path) -> None:
    generator = ScriptedGlm(tiny, '{"a": 1}<|endoftext|>')
    client = sdk(generator)
    client.chat.completions.create(
        model="glm",
        messages=ASK,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        reasoning_effort="none",  # type: ignore[arg-type]
    )
    params = generator.seen[0][1]
    assert params.constraint is not None and params.constraint.active
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="glm", messages=ASK, extra_body={"guided_regex": "(unclosed"})
    assert error.value.body["param"] == "guided_regex"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as error:  # main: compiled, then sampled from -inf rows
        client.chat.completions.create(
            model="glm", messages=ASK, extra_body={"guided_grammar": 'root ::= root "a"'}
        )
    assert error.value.body["param"] == "guided_grammar"  # type: ignore[index]
    assert "no finite string matches" in error.value.body["message"]  # type: ignore[index]


def test_pictures_reach_the_generator(tiny: Path) -> None:
    generator = ScriptedGlm(tiny, "A blue dot.<|endoftext|>")
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is it?"},
                {"type": "image_url", "image_url": {"url": PNG}},
            ],
        }
    ]
    answer = sdk(generator).chat.completions.create(model="glm", messages=messages, reasoning_effort="none")  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "A blue dot."
    prompt_ids, params = generator.seen[0]
    assert params.prefill_inputs is not None and "pixel_values" in params.prefill_inputs
    image = generator.tokenizer.convert_tokens_to_ids("<|image|>")
    assert prompt_ids.count(image) == int(params.prefill_inputs["image_grid_thw"].prod()) // 4


def test_a_model_without_vision_refuses_pictures(fake: FakeGenerator) -> None:
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}]
    with pytest.raises(openai.BadRequestError) as error:
        sdk(fake).chat.completions.create(model="glm", messages=messages)  # type: ignore[arg-type]
    assert "no vision tower" in error.value.message


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"messages": [{"role": "user", "content": [{"type": "bogus"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": 7}}]}]},
        {"messages": [{"role": "tool", "content": "x"}]},
        {
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{"}}],
                }
            ]
        },
    ],
)
def test_tokenize_answers_a_client_mistake_with_a_400(tiny: Path, body: dict[str, Any]) -> None:
    service = EngineService(ScriptedGlm(tiny, "x"), served_name="glm", max_tokens=256)
    client = TestClient(create_app(service), raise_server_exceptions=False)
    for path in ("/tokenize", "/v1/chat/completions"):
        response = client.post(path, json=body)
        assert response.status_code < 500, (path, response.text)
        if response.status_code != 200:
            assert response.json()["error"]["message"]


def test_thinking_budget_reaches_the_generator_as_a_budget_on_the_reasoning(tiny: Path) -> None:
    from sparkfold.glm.budget import ThinkingBudget

    generator = ScriptedGlm(tiny, CALL)
    client = sdk(generator)
    client.chat.completions.create(model="glm", messages=ASK, extra_body={"thinking_budget": 16})
    budget = generator.seen[0][1].constraint
    assert isinstance(budget, ThinkingBudget) and budget.budget == 16
    assert budget.think_end == generator.tokenizer.convert_tokens_to_ids("</think>")
    client.chat.completions.create(
        model="glm", messages=ASK, reasoning_effort="none", extra_body={"thinking_budget": 16}
    )  # type: ignore[arg-type]
    assert generator.seen[1][1].constraint is None  # thinking off: nothing to budget


@pytest.mark.parametrize("penalty", ["frequency_penalty", "presence_penalty"])
def test_penalties_are_refused_naming_the_field_not_ignored(fake: FakeGenerator, penalty: str) -> None:
    client = TestClient(create_app(EngineService(fake, served_name="m", max_tokens=8)))  # type: ignore[arg-type]
    refused = client.post("/v1/chat/completions", json={"messages": ASK, penalty: 0.5})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == penalty
    assert client.post("/v1/chat/completions", json={"messages": ASK, penalty: 0}).status_code == 200


class _Babbler(ScriptedGlm):
    """Says its whole script, GLM stop tokens included (a model that runs on past ``<|user|>``)."""

    def reply_ids(self) -> list[int]:
        return self.encode(self.script)


def test_ignore_eos_generates_max_tokens_past_glm_stop_tokens(tiny: Path) -> None:
    """``ignore_eos``: exactly ``max_tokens`` tokens (vLLM's meaning; benchmarks need equal work), GLM's
    stop tokens included; without it the reply ends at the first one."""
    generator = _Babbler(tiny, "Sure.<|user|>and on<|observation|>and on and on")
    client = TestClient(create_app(EngineService(generator, served_name="glm", max_tokens=256)))
    script = generator.encode(generator.script)
    body = {"prompt": "go", "max_tokens": len(script), "temperature": 0}
    stopped = client.post("/v1/completions", json=body).json()
    ran_on = client.post("/v1/completions", json={**body, "ignore_eos": True}).json()
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["usage"]["completion_tokens"] < len(script)
    assert ran_on["choices"][0]["finish_reason"] == "length"
    assert ran_on["usage"]["completion_tokens"] == len(script)
    assert stopped["tensorfold"]["prepare_s"] > 0  # rendering and tokenizing, in the stats block
