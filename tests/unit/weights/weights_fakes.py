"""What the weights tests share: a small model's files, its commit, and writing them to a folder.

A module of its own, not the conftest: a test module that imports ``conftest`` by name gets
whichever directory's conftest pytest imported first (with tests/unit/node's, these imports failed).
"""

from __future__ import annotations

import random
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def model_files() -> dict[str, bytes]:
    """A small model: two JSON files outside LFS, two LFS shards (one in a folder)."""
    rng = random.Random(7)
    return {
        "config.json": b'{"model_type": "glm"}\n',
        "tokenizer_config.json": b'{"eos_token": "<|endoftext|>"}\n',
        "model-00001-of-00002.safetensors": rng.randbytes(300_000),
        "shards/model-00002-of-00002.safetensors": rng.randbytes(200_000),
    }


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root
