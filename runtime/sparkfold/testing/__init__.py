"""Test fixtures shipped with the package, so users' tests and ours share them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["torch_threads"]


@contextmanager
def torch_threads(count: int = 1) -> Iterator[None]:
    """Run with ``count`` torch threads: tiny models are many times faster on one thread of a busy CPU."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
