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

``--testbed`` measures the fleet testbed instead (``make demo-fleet``: the CPU engine serving the demo
model on two one-node pairs, the router on sffl-a): direct = pair a's gateway on sffl-a with the
router's key, router = the front on sffl-a with a client key; streams of up to 32 tokens of the real
model; affinity read from each pair's own gateway ``/metrics`` over ssh, one turn at a time. For the
run, pair a's gateway filter also lets this host in (one nftables rule, removed at the end by
reloading the filter). Each testbed pair has one lane: use ``--concurrency 1``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [
    str(REPO / "runtime"),
    str(REPO),
    str(REPO / "tests/integration"),
    str(REPO / "tests/testbed"),
]

from fleet_procs import CLIENT_KEY, ROUTER_KEY, Fleet  # noqa: E402
from tests.fakes.scripted_engine import Script  # noqa: E402

TOKENS = 32
PACE_S = 0.01
SYSTEM = "You are a careful assistant. " + "Keep every answer short and exact. " * 90


MODEL = "fake"  # the scripted engines take any name; --testbed sets the demo model's


async def stream(
    client: httpx.AsyncClient, url: str, key: str, messages: list[dict[str, str]]
) -> dict[str, float]:
    body = {"model": MODEL, "messages": messages, "stream": True, "max_tokens": TOKENS}
    if MODEL != "fake":
        body["temperature"] = 0
    sent = time.perf_counter()
    first, count = 0.0, 0
    async with client.stream(
        "POST", url + "/v1/chat/completions", json=body, headers={"x-api-key": key}
    ) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                count += 1
                first = first or time.perf_counter()
    end = time.perf_counter()
    return {"ttft_s": first - sent, "tok_s": count / (end - sent), "tokens": count}


def spread(values: list[float], scale: float = 1.0, digits: int = 2) -> list[float]:
    """The interquartile range (p25, p75) of ``values``, scaled."""
    q = statistics.quantiles(values, n=4)
    return [round(q[0] * scale, digits), round(q[2] * scale, digits)]


async def round_of(client: httpx.AsyncClient, url: str, key: str, n: int) -> list[dict[str, float]]:
    prompt = "Count from one to fifty in words." if MODEL != "fake" else "go"
    messages = [[{"role": "user", "content": f"[{uuid.uuid4().hex[:8]}] {prompt}"}] for _ in range(n)]
    return list(await asyncio.gather(*(stream(client, url, key, m) for m in messages)))


async def overhead(target: Any, rounds: int, levels: list[int]) -> dict[str, Any]:
    direct_url, results = target.direct_url, {}
    keys = {"direct": target.router_key, "router": target.client_key}
    urls = {"direct": direct_url, "router": target.url}
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=256)) as client:
        for n in levels:
            sides: dict[str, list[dict[str, float]]] = {"direct": [], "router": []}
            for side in sides:  # warm-up, both sides
                await round_of(client, urls[side], keys[side], n)
            for _ in range(rounds):
                for side in sides:
                    sides[side] += await round_of(client, urls[side], keys[side], n)
            ttft = {s: statistics.median(r["ttft_s"] for r in v) for s, v in sides.items()}
            toks = {s: statistics.median(r["tok_s"] for r in v) for s, v in sides.items()}
            if MODEL == "fake":
                assert all(r["tokens"] == TOKENS for v in sides.values() for r in v)
            results[str(n)] = {
                "ttft_direct_ms": round(ttft["direct"] * 1000, 2),
                "ttft_router_ms": round(ttft["router"] * 1000, 2),
                "ttft_added_ms": round((ttft["router"] - ttft["direct"]) * 1000, 2),
                "ttft_direct_iqr_ms": spread([r["ttft_s"] for r in sides["direct"]], 1000),
                "ttft_router_iqr_ms": spread([r["ttft_s"] for r in sides["router"]], 1000),
                "tok_s_direct": round(toks["direct"], 1),
                "tok_s_router": round(toks["router"], 1),
                "tok_s_direct_iqr": spread([r["tok_s"] for r in sides["direct"]], digits=1),
                "tok_s_router_iqr": spread([r["tok_s"] for r in sides["router"]], digits=1),
                "tok_s_ratio": round(toks["router"] / toks["direct"], 3),
                "tokens_median": statistics.median(r["tokens"] for v in sides.values() for r in v),
                "streams": len(sides["router"]),
            }
    return results


class Loopback:
    """The loopback fleet of the integration tests, over scripted engines."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.url, self.direct_url = fleet.url, fleet.pair("a").url
        self.client_key, self.router_key = CLIENT_KEY, ROUTER_KEY


class Testbed:
    """The fleet testbed (inventory/fleet-testbed): the router and pair a on sffl-a, pair b on sffl-b."""

    PAIRS: ClassVar[dict[str, str]] = {"pair-a": "198.51.100.130", "pair-b": "198.51.100.131"}
    RULE = "ip saddr 198.51.100.129 tcp dport 8888 accept"

    def __init__(self) -> None:
        from testbed_kit import ssh

        credentials = REPO / ".cache/control/credentials/fleet-testbed"
        self.ssh = ssh
        self.url, self.direct_url = "http://198.51.100.130:8800", "http://198.51.100.130:8888"
        self.client_key = (credentials / "api-key").read_text().strip()
        self.router_key = (credentials / "router-key").read_text().strip()
        self.last = self.counts()

    def counts(self) -> dict[str, float]:
        fetch = (
            "import sys, urllib.request; key = sys.stdin.read().strip(); "
            "req = urllib.request.Request('http://127.0.0.1:8888/metrics', headers={'x-api-key': key}); "
            "print(urllib.request.urlopen(req, timeout=20).read().decode())"
        )
        counts = {}
        for name, address in self.PAIRS.items():
            text = self.ssh(address, f"python3 -c {shlex.quote(fetch)}", stdin=self.router_key)
            counts[name] = sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith('sparkfold_requests_total{route="/v1/chat/completions",status="200"}')
            )
        return counts

    def grew(self) -> list[str]:
        """The pairs that served a chat completion since the last look."""
        now = self.counts()
        grew = [name for name in self.PAIRS if now[name] > self.last[name]]
        self.last = now
        return grew

    def open_direct(self) -> None:
        """Let this host reach pair a's gateway for the run (the filter lets only the router in)."""
        self.ssh(self.PAIRS["pair-a"], f"nft insert rule inet sparkfold_gateway input {self.RULE}")

    def close_direct(self) -> None:
        self.ssh(self.PAIRS["pair-a"], "systemctl reload sparkfold-gateway-filter.service")


async def affinity(target: Any, conversations: int, turns: int) -> dict[str, Any]:
    convs = [(uuid.uuid4().hex, [{"role": "system", "content": ""}]) for _ in range(conversations)]
    for marker, history in convs:
        history[0]["content"] = f"[{marker}] {SYSTEM}"
    # the testbed's pairs have one lane each: one turn at a time, each read from the pairs' counters
    width = 1 if isinstance(target, Testbed) else 2
    served: dict[str, list[tuple[str, int]]] = {marker: [] for marker, _ in convs}
    async with httpx.AsyncClient(timeout=120) as client:
        for turn in range(turns):
            # each turn of every conversation, two conversations at a time (new ones overlap)
            for i in range(0, len(convs), width):
                batch = convs[i : i + width]
                for _, history in batch:
                    history.append({"role": "user", "content": f"turn {turn}: next?"})
                await asyncio.gather(*(stream(client, target.url, target.client_key, h) for _, h in batch))
                for marker, history in batch:
                    history.append({"role": "assistant", "content": "tok" * 4})
                    if isinstance(target, Testbed):
                        served[marker] += [(name, turn) for name in target.grew()]
    homes: list[str] = []
    on_holder = follow_ups = 0
    for marker, _ in convs:
        if isinstance(target, Testbed):
            seen = served[marker]
        else:
            pairs = target.fleet.pairs
            seen = [(p.name, len(str(r))) for p in pairs for r in p.engine.requests if marker in str(r)]
        seen.sort(key=lambda item: item[1])  # by prompt length or turn: turn order
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
    parser.add_argument("--testbed", action="store_true", help="measure the fleet testbed (make demo-fleet)")
    args = parser.parse_args()
    levels = [int(n) for n in args.concurrency.split(",")]
    if args.testbed:
        global MODEL
        MODEL = "SmolLM2-135M-Instruct"
        testbed = Testbed()
        testbed.open_direct()
        try:
            report = {
                "against": "fleet testbed (CPU engine, demo model, one lane per pair)",
                "max_tokens": TOKENS,
                "overhead": asyncio.run(overhead(testbed, args.rounds, levels)),
                "affinity": asyncio.run(affinity(testbed, args.conversations, args.turns)),
            }
        finally:
            testbed.close_direct()
        write(report, args.json)
        return
    with tempfile.TemporaryDirectory(prefix="sparkfold-fleet-bench-") as root:
        fleet = Fleet(Path(root))
        try:
            fleet.start(["a", "b"], gateway={"parallel": 4, "max_queued": 64}, router={})
            for pair in fleet.pairs:
                pair.engine.default = Script(content=["tok"] * TOKENS, pace_s=PACE_S)
            report = {
                "against": "loopback fleet (scripted engines)",
                "tokens": TOKENS,
                "pace_ms": PACE_S * 1000,
                "overhead": asyncio.run(overhead(Loopback(fleet), args.rounds, levels)),
                "affinity": asyncio.run(affinity(Loopback(fleet), args.conversations, args.turns)),
            }
        finally:
            fleet.close()
    write(report, args.json)


def write(report: dict[str, Any], path: Path | None) -> None:
    text = json.dumps(report, indent=2)
    print(text)
    if path:
        path.write_text(text + "\n")


if __name__ == "__main__":
    main()
