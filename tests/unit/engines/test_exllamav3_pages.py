"""Free KV pages first (``sparkfold.engines.exllamav3.pages``) on stand-in pages; the same order as
exllamav3's own page table, allocation by allocation: ``tests/gpu/test_exllamav3_page_order.py``."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest

from sparkfold.engines.exllamav3.pages import FreePagesFirst, take_free_pages_first


def page(index: int, serial: int, kv: int = 0, refs: int = 0) -> SimpleNamespace:
    return SimpleNamespace(
        page_index=index, access_serial=serial, kv_position=kv, ref_count=refs, phash=b"%d" % index
    )


class Table:
    """A page table's surface the order reads: its unreferenced pages and its own order's builder."""

    def __init__(self, pages: list[SimpleNamespace], policy: str = "tree") -> None:
        self.unreferenced_pages = {p.phash: p for p in pages}
        self.eviction_policy = policy
        self.built: list[set[bytes]] = []

    def build_eviction_order(self, protected_hashes: set[bytes] | None = None) -> deque[Any]:
        self.built.append(set(protected_hashes or ()))
        return deque(sorted(self.unreferenced_pages.values(), key=lambda p: -p.page_index))


def test_the_empty_pages_come_first_oldest_first_without_building_the_whole_order() -> None:
    table = Table([page(0, 9), page(1, 3), page(2, 5, kv=256), page(3, 1), page(4, 2, kv=17)])
    assert take_free_pages_first(table)
    order = table.build_eviction_order(set())
    assert [order.popleft().page_index for _ in range(3)] == [3, 1, 0]
    assert table.built == [] and not order.built_rest


def test_past_the_empty_pages_the_whole_order_is_built_once_with_the_protected_hashes() -> None:
    table = Table([page(0, 9), page(1, 3, kv=256), page(2, 5, kv=256)])
    assert take_free_pages_first(table)
    order = table.build_eviction_order({b"1"})
    assert order.popleft().page_index == 0
    assert order[0].page_index == 2 and order.built_rest  # the stand-in's own order: highest index first
    assert [order.popleft().page_index for _ in range(3)] == [2, 1, 0]
    assert table.built == [{b"1"}]
    with pytest.raises(IndexError):  # an exhausted order ends as exllamav3's deque does
        order.popleft()


def test_a_protected_empty_page_is_not_taken_first() -> None:
    pages = [page(0, 1), page(1, 2)]
    order = FreePagesFirst(pages, {b"0"}, lambda: deque(pages[::-1]))
    assert [order.popleft().page_index, order.popleft().page_index] == [1, 1]  # then the whole order


def test_ties_in_access_keep_the_pools_order() -> None:
    pages = [page(5, 1), page(2, 1), page(7, 0)]
    order = FreePagesFirst(pages, set(), deque)
    assert [order.popleft().page_index for _ in range(3)] == [7, 5, 2]


def test_another_eviction_policy_keeps_exllamav3s_order() -> None:
    table = Table([page(0, 9), page(1, 3)], policy="lru")
    assert take_free_pages_first(table)
    order = table.build_eviction_order(None)
    assert isinstance(order, deque) and order[0].page_index == 1 and table.built == [set()]


def test_only_the_head_is_read() -> None:
    order = FreePagesFirst([page(0, 0), page(1, 1)], set(), deque)
    with pytest.raises(IndexError, match="head"):
        order[1]


def test_a_page_table_of_another_shape_keeps_its_own_order() -> None:
    table = SimpleNamespace(build_eviction_order=deque, unreferenced_pages={})  # no eviction_policy
    assert not take_free_pages_first(table) and table.build_eviction_order is deque
