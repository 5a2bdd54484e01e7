"""The fleet router's cost and its affinity, in one run: two pairs behind SMG and the front on loopback.

Processes (``tests/integration/fleet_procs.py``, the same fleet the tests use): two gateways
(``sparkfold api``) over scripted engines that stream at a fixed pace, SMG (``sparkfold router``)
and the front (``sparkfold fleet``). This client measures, round by round in turns (direct, then
through the router, so drift on the machine hits both alike):

- *TTFT*: request sent to the first content token, straight to pair a's gateway and through the
  front + SMG to whichever pair it picks (added = difference of the medians);
- *tok/s*: each stream's content tokens over its whole duration (ratio = router / direct, medians);
- *spread*: which pair each new conversation's first turn went to;
- *affinity*: the share of follow-up turns (multi-turn conversations, the whole history resent
  each turn) that landed on the pair that served the conversation's first turn, read from the
  pairs' own engines.

    python tests/bench/fleet_bench.py [--rounds 30] [--concurrency 1,4] [--conversations 12] [--turns 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "runtime"), str(REPO), str(REPO / "tests/integration")]

from fleet_procs import CLIENT_KEY, ROUTER_KEY, Fleet  # noqa: E402
from tests.fakes.scripted_engine import Script  # noqa: E402

TOKENS = 32
PACE_S = 0.01
SYSTEM = "You are a careful assistant. " + "Keep every answer short and exact. " * 90


async def stream(
    client: httpx.AsyncClient, url: str, key: str, messages: list[dict[str, str]]
) -> dict[str, float]:
    body = {"model": "fake", "messages": messages, "stream": True, "max_tokens": TOKENS}
    sent = time.perf_counter()
    first, count = 0.0, 0
    async with client.stream(
        "POST", url + "/v1/chat/completions", json=body, headers={"x-api-key": key}
    ) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if '"content":"tok"' in line:
                count += 1
                first = first or time.perf_counter()
    end = time.perf_counter()
    return {"ttft_s": first - sent, "tok_s": count / (end - sent), "tokens": count}


async def round_of(client: httpx.AsyncClient, url: str, key: str, n: int) -> list[dict[str, float]]:
    messages = [[{"role": "user", "content": f"{uuid.uuid4().hex} go"}] for _ in range(n)]
    return list(await asyncio.gather(*(stream(client, url, key, m) for m in messages)))


async def overhead(fleet: Fleet, rounds: int, levels: list[int]) -> dict[str, Any]:
    direct_url, results = fleet.pair("a").url, {}
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=256)) as client:
        for n in levels:
            sides: dict[str, list[dict[str, float]]] = {"direct": [], "router": []}
            await round_of(client, direct_url, ROUTER_KEY, n)  # warm-up, both sides
            await round_of(client, fleet.url, CLIENT_KEY, n)
            for _ in range(rounds):
                sides["direct"] += await round_of(client, direct_url, ROUTER_KEY, n)
                sides["router"] += await round_of(client, fleet.url, CLIENT_KEY, n)
            ttft = {s: statistics.median(r["ttft_s"] for r in v) for s, v in sides.items()}
            toks = {s: statistics.median(r["tok_s"] for r in v) for s, v in sides.items()}
            assert all(r["tokens"] == TOKENS for v in sides.values() for r in v)
            results[str(n)] = {
                "ttft_direct_ms": round(ttft["direct"] * 1000, 2),
                "ttft_router_ms": round(ttft["router"] * 1000, 2),
                "ttft_added_ms": round((ttft["router"] - ttft["direct"]) * 1000, 2),
                "tok_s_direct": round(toks["direct"], 1),
                "tok_s_router": round(toks["router"], 1),
                "tok_s_ratio": round(toks["router"] / toks["direct"], 3),
                "streams": len(sides["router"]),
            }
    return results


async def affinity(fleet: Fleet, conversations: int, turns: int) -> dict[str, Any]:
    convs = [(uuid.uuid4().hex, [{"role": "system", "content": ""}]) for _ in range(conversations)]
    for marker, history in convs:
        history[0]["content"] = f"[{marker}] {SYSTEM}"
    async with httpx.AsyncClient(timeout=60) as client:
        for turn in range(turns):
            # each turn of every conversation, two conversations at a time (new ones overlap)
            for i in range(0, len(convs), 2):
                batch = convs[i : i + 2]
                for _, history in batch:
                    history.append({"role": "user", "content": f"turn {turn}: next?"})
                await asyncio.gather(*(stream(client, fleet.url, CLIENT_KEY, h) for _, h in batch))
                for _, history in batch:
                    history.append({"role": "assistant", "content": "tok" * 4})
    homes: list[str] = []
    on_holder = follow_ups = 0
    for marker, _ in convs:
        seen = [(p.name, len(str(r))) for p in fleet.pairs for r in p.engine.requests if marker in str(r)]
        seen.sort(key=lambda item: item[1])  # by prompt length: turn order
        home = seen[0][0]
        homes.append(home)
        follow_ups += len(seen) - 1
        on_holder += sum(name == home for name, _ in seen[1:])
    return {
        "conversations": conversations,
        "turns": turns,
        "first_turns_per_pair": {name: homes.count(name) for name in sorted(set(homes))},
        "follow_ups": follow_ups,
        "follow_ups_on_holder": on_holder,
        "share_on_holder": round(on_holder / follow_ups, 4) if follow_ups else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=30, help="measured rounds per side and level")
    parser.add_argument("--concurrency", default="1,4", help="simultaneous streams per round, e.g. 1,4")
    parser.add_argument("--conversations", type=int, default=12, help="multi-turn conversations (even)")
    parser.add_argument("--turns", type=int, default=4, help="turns per conversation")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sparkfold-fleet-bench-") as root:
        fleet = Fleet(Path(root))
        try:
            fleet.start(["a", "b"], gateway={"parallel": 4, "max_queued": 64}, router={})
            for pair in fleet.pairs:
                pair.engine.default = Script(content=["tok"] * TOKENS, pace_s=PACE_S)
            levels = [int(n) for n in args.concurrency.split(",")]
            report = {
                "tokens": TOKENS,
                "pace_ms": PACE_S * 1000,
                "overhead": asyncio.run(overhead(fleet, args.rounds, levels)),
                "affinity": asyncio.run(affinity(fleet, args.conversations, args.turns)),
            }
        finally:
            fleet.close()
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
