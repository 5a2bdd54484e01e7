"""Sizing the KV pool and the request window (pure: unit-tested without a GPU).

The pool is sized once, at start, from free GPU memory minus the weights and a reserve, and
capped by the window; a request never allocates GPU memory of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkfold.units import GIB

__all__ = [
    "PAGE_TOKENS",
    "PoolTooSmall",
    "cache_layer",
    "plan_pool",
    "request_window",
    "round_pages",
    "weight_bytes",
]

PAGE_TOKENS = 256
"""exllamav3's cache page: pools and windows are whole pages."""
QUANT_BITS = {"q8": 8, "q6": 6, "q4": 4}


class PoolTooSmall(ValueError):
    """Free GPU memory cannot hold the weights, the reserve and one window of KV cache."""


def round_pages(tokens: int) -> int:
    """``tokens`` rounded down to whole cache pages."""
    return max(tokens, 0) // PAGE_TOKENS * PAGE_TOKENS


def plan_pool(
    *,
    free_bytes: int,
    weight_bytes: int,
    reserve_bytes: int,
    bytes_per_token: float,
    window: int,
    parallel: int,
    configured: int = 0,
) -> int:
    """Tokens of the shared KV pool: what free memory holds after weights and reserve, in pages.

    Capped at ``parallel`` full windows (more can never be used at once) and at ``configured``
    when set. Raises :class:`PoolTooSmall` when not even one page fits, or when ``configured``
    asks for more than fits.
    """
    if bytes_per_token <= 0:
        raise ValueError("bytes_per_token must be positive")
    spare = free_bytes - weight_bytes - reserve_bytes
    fits = round_pages(int(spare // bytes_per_token)) if spare > 0 else 0
    room = f"{max(spare, 0) / GIB:.1f} GiB"
    costs = f"weights {weight_bytes / GIB:.1f} GiB, reserve_gib {reserve_bytes / GIB:.1f} GiB"
    if configured:
        if configured > fits:
            wanted = f"{configured * bytes_per_token / GIB:.1f} GiB"
            raise PoolTooSmall(
                f"engine.exllamav3.pool_tokens = {configured} needs {wanted} of KV; {room} free ({costs})"
            )
        return configured
    useful = round_pages(parallel * window + PAGE_TOKENS - 1) or PAGE_TOKENS
    if fits < PAGE_TOKENS:
        raise PoolTooSmall(f"no room for a KV pool: {room} free ({costs}); lower reserve_gib or the model")
    return min(fits, useful)


def request_window(context: int, pool_tokens: int, draft_tokens: int, max_positions: int | None) -> int:
    """The per-request window: ``context``, but never more than the pool (minus draft headroom) holds."""
    headroom = draft_tokens + 1
    window = min(context, pool_tokens - headroom)
    if max_positions:
        window = min(window, max_positions)
    return window


def weight_bytes(*directories: str | Path) -> int:
    """Bytes of the safetensors files in these model directories (an upper bound of what loads)."""
    return sum(f.stat().st_size for d in directories for f in Path(d).glob("*.safetensors"))


def cache_layer(exl: Any, cache: str) -> tuple[Any, dict[str, int]]:
    """exllamav3's cache layer class and its keyword arguments for ``engine.exllamav3.cache``."""
    if cache == "fp16":
        return exl.CacheLayer_fp16, {}
    bits = QUANT_BITS[cache]
    return exl.CacheLayer_quant, {"k_bits": bits, "v_bits": bits}
