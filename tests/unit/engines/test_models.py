from __future__ import annotations

from pathlib import Path

import pytest

from sparkfold.engines.models import resolve_model


def test_model_names_resolve(tmp_path: Path) -> None:
    assert resolve_model("smollm2").gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    (tmp_path / "m.gguf").write_bytes(b"")
    assert resolve_model(str(tmp_path / "m.gguf")).path == tmp_path
    assert resolve_model(str(tmp_path)).gguf_file is None
    with pytest.raises(FileNotFoundError, match=r"engine\.model"):
        resolve_model(str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match=r"engine\.transformers\.gguf_file"):
        resolve_model(str(tmp_path), "other.gguf")
