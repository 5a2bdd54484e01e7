"""A window-sized prompt through the whole serving path on a CPU: the openai SDK → the gateway
(default limits and timeouts) → the engine server (GLM rendering, the tiny GLM tokenizer) → a
scripted GLM reply. Nothing on the way may refuse a 1,048,576-token request by default (body
limits, rendering, tokenizing, the window check); the GPU's own prefill of such a prompt is
``tests/bench/long_window.py``."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from tests.fakes.harness import settings_for
from tests.fakes.scripted_engine import ServerThread
from tests.fakes.scripted_glm import ScriptedGlm
from tests.gpu.gpu_engine import text_of

from sparkfold.api import create_app as create_gateway
from sparkfold.engines.server import create_app as create_engine
from sparkfold.engines.service import EngineService

WINDOW = 1_048_576

pytestmark = pytest.mark.slow


def test_a_window_sized_chat_prompt_is_answered(tmp_path: Path) -> None:
    from sparkfold.testing.tiny_glm import write_tiny_glm

    generator = ScriptedGlm(write_tiny_glm(tmp_path / "tiny"), "Sure.<|user|>")
    generator.context_length = WINDOW
    text = text_of(generator.tokenizer, WINDOW - 512, 1)
    service = EngineService(generator, served_name="glm", max_tokens=64)
    with ServerThread(create_engine(service)) as engine:
        port = int(engine.url.rsplit(":", 1)[1])
        with ServerThread(create_gateway(settings_for(port))) as gateway:
            client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=300)
            reply = client.chat.completions.create(
                model="glm", messages=[{"role": "user", "content": text}], max_tokens=8
            )
    assert reply.usage is not None and WINDOW - 1024 < reply.usage.prompt_tokens <= WINDOW
    assert len(generator.seen[0][0]) == reply.usage.prompt_tokens
