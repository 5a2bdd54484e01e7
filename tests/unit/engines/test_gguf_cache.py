"""The CPU engine's GGUF model dequantized once per node (engines/transformers/gguf_cache.py)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sparkfold.config import EngineSettings
from sparkfold.engines.models import ModelSource, resolve_model
from sparkfold.engines.transformers import backend
from sparkfold.engines.transformers.gguf_cache import ENV, converted_folder, keep


class Saves:
    """A model or tokenizer whose ``save_pretrained`` writes one file (or fails)."""

    def __init__(self, name: str, fail: bool = False) -> None:
        self.name, self.fail = name, fail
        self.config = SimpleNamespace()

    def parameters(self) -> list[torch.Tensor]:
        return [torch.zeros(2)]

    def buffers(self) -> list[torch.Tensor]:
        return []

    def save_pretrained(self, folder: Path) -> None:
        if self.fail:
            raise OSError(28, "No space left on device")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / self.name).write_text(self.name)


@pytest.fixture
def gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelSource:
    (tmp_path / "m.Q4.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv(ENV, str(tmp_path / "cache"))
    return ModelSource(tmp_path, "m.Q4.gguf")


def test_only_a_gguf_file_with_the_cache_set_has_a_folder(
    gguf: ModelSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = converted_folder(gguf, "float32")
    assert folder is not None and folder.parent == Path(os.environ[ENV]) and folder.name.startswith("m.Q4-")
    assert converted_folder(ModelSource(gguf.path), "float32") is None  # a Hugging Face folder
    assert converted_folder(gguf, "bfloat16") != folder
    monkeypatch.delenv(ENV)
    assert converted_folder(gguf, "float32") is None


def test_a_changed_file_gets_a_new_folder_and_the_older_one_goes(gguf: ModelSource) -> None:
    first = converted_folder(gguf, "float32")
    assert first is not None
    keep(first, Saves("model"), Saves("tokenizer"))
    assert sorted(p.name for p in first.iterdir()) == ["model", "tokenizer"]
    file = gguf.path / "m.Q4.gguf"
    file.write_bytes(b"GGUF, repaired")  # the weights stage copied it again
    os.utime(file, ns=(1, 1))
    second = converted_folder(gguf, "float32")
    assert second is not None and second != first
    keep(second, Saves("model"), Saves("tokenizer"))
    assert [p.name for p in second.parent.iterdir()] == [second.name]


def test_a_folder_that_cannot_be_written_costs_only_the_next_start_its_conversion(
    gguf: ModelSource, caplog: pytest.LogCaptureFixture
) -> None:
    folder = converted_folder(gguf, "float32")
    assert folder is not None
    with caplog.at_level(logging.WARNING):
        keep(folder, Saves("model"), Saves("tokenizer", fail=True))
    assert not folder.exists() and list(folder.parent.iterdir()) == []  # no partial folder left
    assert "(the next start converts it again): [Errno 28] No space left on device" in caplog.text


@pytest.mark.slow
def test_the_demo_model_read_back_from_its_converted_copy_is_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, str(tmp_path))
    settings = EngineSettings(model="smollm2")
    source = resolve_model("smollm2")
    converted, tokenizer = backend._load_weights(settings, source)
    folder = converted_folder(source, settings.transformers.dtype)
    assert folder is not None and (folder / "config.json").is_file()
    assert backend._readable(settings, source) == (ModelSource(folder), None)
    again, tokenizer_again = backend._load_weights(settings, source)
    assert converted.state_dict().keys() == again.state_dict().keys()
    assert all(torch.equal(t, again.state_dict()[k]) for k, t in converted.state_dict().items())
    text = "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n"
    assert tokenizer(text)["input_ids"] == tokenizer_again(text)["input_ids"]
    assert tokenizer.eos_token_id == tokenizer_again.eos_token_id
