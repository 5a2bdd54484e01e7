"""Structured outputs through the real GLM-5.3-Flash model code (the tiny random model, CPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch

from sparkfold.glm.grammar import GrammarCompiler, constraint_from_request
from sparkfold.glm.logits import GrammarLogitsProcessor
from sparkfold.glm.parser import parse_output
from sparkfold.glm.render import PromptRenderer
from sparkfold.protocol import ChatCompletionRequest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 6},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "hourly": {"type": "boolean"},
        "unit": {"enum": ["C", "F"]},
    },
    "required": ["city", "days", "hourly", "unit"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def model(tiny_glm: Path) -> Any:
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(tiny_glm), dtype=torch.float32).eval()


class ForceThinkEnd:
    """Test stand-in for a model that decides to end its reasoning after ``step`` tokens."""

    def __init__(self, prompt_length: int, step: int, token: int) -> None:
        self.at = prompt_length + step
        self.token = token

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] == self.at:
            forced = torch.full_like(scores, float("-inf"))
            forced[:, self.token] = 0.0
            return forced
        return scores


def generate(
    model: Any, tokenizer: Any, body: dict[str, Any], seed: int, *, force_think_end_at: int | None = None
) -> tuple[str, Any]:
    request = ChatCompletionRequest.model_validate(body)
    rendered = PromptRenderer().render_request(request)
    compiler = GrammarCompiler(tokenizer, vocab_size=model.config.text_config.vocab_size)
    constraint = constraint_from_request(request)
    assert constraint is not None
    matcher = compiler.matcher(constraint, thinking=rendered.options.thinking)
    inputs = tokenizer(rendered.text, return_tensors="pt", add_special_tokens=False)
    width = inputs.input_ids.shape[1]
    processors: list[Any] = []
    if force_think_end_at is not None:
        processors.append(ForceThinkEnd(width, force_think_end_at, compiler.think_end_id or -1))
    processors.append(GrammarLogitsProcessor([matcher], width))
    torch.manual_seed(seed)
    out = model.generate(
        **inputs,
        logits_processor=processors,
        eos_token_id=compiler.stop_token_ids,  # what an engine stops on
        do_sample=True,
        temperature=1.0,
        top_k=0,
        max_new_tokens=60,
    )
    text = tokenizer.decode(out[0, width:], skip_special_tokens=False)
    matcher.accept_token(int(out[0, -1]))  # generate stops before the processor sees its last token
    return text, matcher


def chat(**extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "Weather?"}], **extra}


def test_json_schema_output_validates_on_twenty_seeds(model: Any, tokenizer: Any) -> None:
    body = chat(
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}},
        chat_template_kwargs={"enable_thinking": False},
    )
    outputs = set()
    for seed in range(20):
        text, matcher = generate(model, tokenizer, body, seed)
        assert matcher.is_terminated(), text
        message = parse_output(text, thinking=False)
        jsonschema.validate(json.loads(message.content), SCHEMA)
        outputs.add(message.content)
    assert len(outputs) > 1  # the seeds really sampled different replies


def test_guided_choice_returns_one_of_the_choices(model: Any, tokenizer: Any) -> None:
    choices = ["alpha", "beta", "gamma delta"]
    body = chat(guided_choice=choices, reasoning_effort="none")
    for seed in range(5):
        text, _ = generate(model, tokenizer, body, seed)
        assert parse_output(text, thinking=False).content in choices


def test_the_think_block_still_closes_and_the_grammar_follows(model: Any, tokenizer: Any) -> None:
    body = chat(
        response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}}, reasoning_effort="low"
    )
    text, matcher = generate(model, tokenizer, body, seed=3, force_think_end_at=6)
    message = parse_output(text, thinking=True)
    assert "</think>" in text and matcher.is_terminated()
    assert message.reasoning  # free text before </think>, not constrained
    jsonschema.validate(json.loads(message.content), SCHEMA)
