"""The threads that prepare requests: rendering, tokenizing, picture decoding, grammar compilation.

That work never runs on the event loop that streams every other reply, nor on the engine thread
that steps the model. A request body past :data:`LONG_BODY_BYTES` gets a worker of its own, so a
short request is not prepared behind a long prompt (seconds at 1M tokens).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["LONG_BODY_BYTES", "PromptWorkers"]

T = TypeVar("T")

LONG_BODY_BYTES = 262_144
"""A request body past this is prepared in the long prompts' worker."""


class PromptWorkers:
    """One worker thread for short request bodies and one for long ones, each one request at a time."""

    def __init__(self) -> None:
        self._short = ThreadPoolExecutor(1, thread_name_prefix="prepare")
        self._long = ThreadPoolExecutor(1, thread_name_prefix="prepare-long")

    async def run(self, work: Callable[..., T], *args: object, body_bytes: int = 0) -> T:
        """``work(*args)`` in a worker thread: the long prompts' one when the request's body has
        more than :data:`LONG_BODY_BYTES`."""
        worker = self._long if body_bytes > LONG_BODY_BYTES else self._short
        return await asyncio.get_running_loop().run_in_executor(worker, work, *args)
