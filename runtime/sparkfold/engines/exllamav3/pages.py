"""Free KV pages first: a job's start takes empty pages without ordering the whole pool.

exllamav3's ``PageTable.allocate_pages`` (``exllamav3/generator/pagetable.py``, 1.6.5) takes the
pages a job's prompt misses, and the pages it will generate into, from
``PageTable.build_eviction_order``: every unreferenced page, least valuable first. That order puts
the empty pages first (no K/V in them, oldest access first), then the cached sequences, which it
finds by linking every page of the pool into prefix trees in Python. It is built at every job start
that misses a page, so with a large pool (32,769 pages for 8.4M tokens) each new request stops
every decoding stream for that walk, even while the empty pages alone would serve it.

:func:`take_free_pages_first` gives a page table an order with the same head built lazily: the
empty pages, ordered as exllamav3 orders them, and only once a job needs more than those, the
rest of exllamav3's own order (cached sequences pruned tail-first, the least recently used first),
built on the pool as it is then. A job that the empty pages serve never builds the trees; one that
evicts sees exllamav3's choice of victims. Prefix reuse is untouched: hash matches are resolved by
``allocate_pages`` before it asks for an evictable page.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection
from operator import attrgetter
from typing import Any

__all__ = ["FreePagesFirst", "take_free_pages_first"]

_by_access = attrgetter("access_serial")


class FreePagesFirst:
    """The eviction order one allocation consumes: ``allocate_pages`` reads its head (``[0]``) and
    takes it (``popleft()``), as it does with the ``deque`` exllamav3 builds.

    ``pages``: the page table's unreferenced pages (``unreferenced_pages.values()``); ``protected``:
    hashes the allocation is about to claim (never among the empty pages first, as in exllamav3);
    ``rest``: builds exllamav3's whole order, called once the empty pages are taken.
    """

    def __init__(
        self, pages: Collection[Any], protected: Collection[bytes], rest: Callable[[], deque[Any]]
    ) -> None:
        # a stable sort of the dict's order: ties fall as in exllamav3's own sort of the same pages
        self._free = deque(
            sorted((p for p in pages if p.kv_position == 0 and p.phash not in protected), key=_by_access)
        )
        self._rest: deque[Any] | None = None
        self._build_rest = rest

    def _queue(self) -> deque[Any]:
        if self._free:
            return self._free
        if self._rest is None:
            self._rest = self._build_rest()
        return self._rest

    def __getitem__(self, index: int) -> Any:
        if index != 0:
            raise IndexError("only the head of the eviction order is read")
        return self._queue()[0]

    def popleft(self) -> Any:
        return self._queue().popleft()

    @property
    def built_rest(self) -> bool:
        """Whether this allocation needed more than the empty pages."""
        return self._rest is not None


_SURFACE = ("build_eviction_order", "unreferenced_pages", "eviction_policy")
"""What :func:`take_free_pages_first` reads of exllamav3's ``PageTable`` (1.6.5)."""


def take_free_pages_first(pagetable: Any) -> bool:
    """Serve ``pagetable``'s allocations from its empty pages before building exllamav3's whole
    eviction order (:class:`FreePagesFirst`); whether it could (a page table without the surface
    this reads keeps its own order). Only exllamav3's default ``"tree"`` policy has the empty pages
    at its head; under another ``eviction_policy`` its own order is used as it is."""
    if not all(hasattr(pagetable, name) for name in _SURFACE):
        return False
    full_order = pagetable.build_eviction_order

    def order(protected_hashes: set[bytes] | None = None) -> Any:
        protected = protected_hashes or set()
        if pagetable.eviction_policy != "tree":
            return full_order(protected)
        return FreePagesFirst(pagetable.unreferenced_pages.values(), protected, lambda: full_order(protected))

    pagetable.build_eviction_order = order
    return True
