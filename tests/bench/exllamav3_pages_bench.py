"""What a job's start costs the thread that steps exllamav3's generator: ``PageTable.allocate_pages``
with exllamav3's own eviction order and with free pages first (``sparkfold.engines.exllamav3.pages``).

Two page tables of the engine's pool (``--pool-tokens``, default the bench-size fixture's 8,388,864
tokens: 32,769 pages) hold the same cached sequences (``--cached-pages`` of complete, unreferenced
pages in chains of 16, as finished replies leave them). Then ``--jobs`` short jobs start in turn
on each table, alternating (a prompt page that misses, two pages to generate into, as a short chat
turn), and end. Each allocation is timed; the tables must hand out the same pages. With
``--cached-pages`` near the pool every start evicts, and free pages first pays its filter on top.
Needs exllamav3 (its page table is Python; no GPU):

    python tests/bench/exllamav3_pages_bench.py [--pool-tokens N] [--cached-pages N] [--jobs N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtime"))
from sparkfold.engines.exllamav3.pages import take_free_pages_first
from sparkfold.testing.page_tables import bare_page_table, page_hash

CHAIN = 16


def _table(pool_tokens: int, cached_pages: int, free_first: bool) -> Any:
    from exllamav3.generator.pagetable import PAGE_SIZE

    table = bare_page_table(pool_tokens)
    if free_first:
        take_free_pages_first(table)
    for chain in range(cached_pages // CHAIN):  # finished replies: complete pages, released
        hashes = [page_hash(None, (chain, 0))]
        for i in range(1, CHAIN):
            hashes.append(page_hash(hashes[-1], (chain, i)))
        pages, *_ = table.allocate_pages(hashes, 0, None, set(hashes))
        for i, page in enumerate(pages):
            page.kv_position, page.prev_hash = PAGE_SIZE, pages[i - 1].phash if i else None
        table.deallocate_pages(pages)
    return table


def _start(table: Any, job: int) -> tuple[float, tuple[int, ...]]:
    """One short job's allocation, timed, then its end (its prompt page complete, its reply not)."""
    from exllamav3.generator.pagetable import PAGE_SIZE

    hashes = [page_hash(None, ("job", job))]
    started = time.perf_counter()
    pages, *_ = table.allocate_pages(hashes, 2, None, set(hashes))
    seconds = time.perf_counter() - started
    pages[0].kv_position = PAGE_SIZE
    pages[1].prev_hash, pages[1].kv_position = pages[0].phash, 40
    table.deallocate_pages(pages)
    return seconds, tuple(p.page_index for p in pages)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pool-tokens", type=int, default=8_388_864)
    parser.add_argument("--cached-pages", type=int, default=2048)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    tables = {
        name: _table(args.pool_tokens, args.cached_pages, name == "free first")
        for name in ("own", "free first")
    }
    seconds: dict[str, list[float]] = {name: [] for name in tables}
    for job in range(args.jobs):
        got = {}
        for name, table in tables.items():
            spent, got[name] = _start(table, job)
            seconds[name].append(spent)
        if got["own"] != got["free first"]:
            print(f"job {job}: the tables handed out different pages: {got}", file=sys.stderr)
            return 1
    figures: dict[str, Any] = {
        "pages": tables["own"].max_pages,
        "cached_pages": args.cached_pages,
        "jobs": args.jobs,
        "empty_pages_at_start": args.pool_tokens // 256 - args.cached_pages,
    }
    for name, values in seconds.items():
        figures[name] = {
            "median_ms": round(statistics.median(values) * 1000, 3),
            "max_ms": round(max(values) * 1000, 3),
        }
    figures["median_ratio"] = round(figures["own"]["median_ms"] / figures["free first"]["median_ms"], 1)
    print(json.dumps(figures, indent=1))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
