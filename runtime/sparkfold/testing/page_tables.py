"""exllamav3 page tables with no model behind them, for the tests and the benchmark of free pages
first (:mod:`sparkfold.engines.exllamav3.pages`): ``PageTable`` (``exllamav3/generator/pagetable.py``,
1.6.5) is Python, and its allocation reads nothing of the generator and the cache but the two
attributes given here, so it runs without a GPU (exllamav3 must be importable)."""

from __future__ import annotations

import hashlib
import importlib
from types import SimpleNamespace
from typing import Any

__all__ = ["bare_page_table", "page_hash"]


def page_hash(prev: bytes | None, content: object) -> bytes:
    """A page's hash in a chain: a stand-in for exllamav3's hash of the page's tokens after ``prev``."""
    return hashlib.blake2b(repr((prev, content)).encode(), digest_size=16).digest()


def bare_page_table(pool_tokens: int) -> Any:
    """exllamav3's ``PageTable`` for a pool of ``pool_tokens``, no recurrent cache, no defrag."""
    pagetable = importlib.import_module("exllamav3.generator.pagetable")
    generator = SimpleNamespace(recurrent_cache=None, enable_defrag=False)
    return pagetable.PageTable(generator, SimpleNamespace(max_num_tokens=pool_tokens))
