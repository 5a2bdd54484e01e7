"""Free KV pages first (``sparkfold.engines.exllamav3.pages``) against exllamav3's own page table.

Two ``PageTable``s (``exllamav3/generator/pagetable.py``) of a small pool take the same traffic:
prompts that share prefixes, replies that fill pages, jobs that end out of order, enough of it that
cached sequences are evicted. One orders its evictable pages itself, the other takes the empty pages
first; every allocation must get the same pages and the same cached prefix. Needs exllamav3 (not a
GPU: the page table is Python), hence here, where exllamav3 is installed.
"""

from __future__ import annotations

import random
from typing import Any

from sparkfold.engines.exllamav3.pages import take_free_pages_first
from sparkfold.testing.page_tables import bare_page_table, page_hash

POOL_PAGES = 48


def _traffic(free_first: bool, seed: int) -> tuple[list[tuple[Any, ...]], int, dict[str, int]]:
    """What each allocation got (page indices, cached pages), how often the whole eviction order was
    built, and the table's counters."""
    from exllamav3.generator.pagetable import PAGE_SIZE

    table = bare_page_table(POOL_PAGES * PAGE_SIZE)
    builds = 0
    own_order = table.build_eviction_order

    def counted(protected_hashes: set[bytes] | None = None) -> Any:
        nonlocal builds
        builds += 1
        return own_order(protected_hashes)

    table.build_eviction_order = counted
    if free_first:
        take_free_pages_first(table)
    rng = random.Random(seed)
    live: list[list[Any]] = []
    got = []
    for step in range(300):
        family, shared = rng.randrange(4), rng.randrange(0, 7)
        hashes: list[bytes] = []
        for i in range(shared + rng.randrange(0, 4)):
            content = (family, i) if i < shared else (step, i)
            hashes.append(page_hash(hashes[-1] if hashes else None, content))
        new_pages = rng.randrange(1, 4)
        while len(hashes) + new_pages > table.num_unreferenced_pages() and live:
            table.deallocate_pages(live.pop(0))
        pages, _, cached, _ = table.allocate_pages(hashes, new_pages, None, set(hashes))
        got.append((tuple(p.page_index for p in pages), cached))
        for i, p in enumerate(pages):  # the prompt read, the reply written: every page full but the last
            p.prev_hash = pages[i - 1].phash if i else None
            p.kv_position = PAGE_SIZE if i < len(pages) - 1 else rng.randrange(1, PAGE_SIZE)
            if i >= len(hashes) and i < len(pages) - 1:
                p.update_hash(page_hash(p.prev_hash, (step, "reply", i)))
        live.append(pages)
        if len(live) > 3 or rng.random() < 0.3:
            table.deallocate_pages(live.pop(rng.randrange(len(live))))
    return got, builds, table.metrics


def test_free_pages_first_allocates_as_exllamav3_does_and_walks_the_pool_less() -> None:
    for seed in range(4):
        own, own_builds, metrics = _traffic(free_first=False, seed=seed)
        ours, our_builds, _ = _traffic(free_first=True, seed=seed)
        differ = [i for i, (a, b) in enumerate(zip(ours, own, strict=True)) if a != b]
        assert not differ, f"seed {seed}: allocations {differ[:5]} got other pages"
        assert metrics["evictions_live"] > 0 and metrics["alloc_cached_pages"] > 0  # evicted, and reused
        assert our_builds < own_builds
