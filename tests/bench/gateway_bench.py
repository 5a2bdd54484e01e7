"""Gateway overhead: the same streamed load sent straight to an engine server and through the gateway.

Three processes: a synthetic engine (the scripted engine double, streaming at a fixed pace), the
gateway (`sparkfold api`: one process, one event-loop thread, so one core at most), and this load
generator (a raw-socket SSE client, cheap enough not to be the bottleneck). With ``--pin`` (the
default on two or more cores) the gateway gets the last allowed core to itself and the engine and
the client share the others, so the straight and gateway sides see the same engine and client
and the gateway never queues behind them. In one run it measures:

- *TTFT*: request sent to the first content token, straight and through the gateway (added = the
  difference), pooled over many short rounds at 1, 4, 16 and 64 simultaneous streams (a burst: every
  stream of a round sent at the same moment), and in a steady state (each of N clients sends its
  next request when its previous reply ends, the clients' first requests spread over one reply's
  length, so N streams run at all times and requests arrive one by one);
- *tok/s*: the aggregate streamed tokens/s at each concurrency (ratio = through / straight);
- *CPU per request*: the gateway's process CPU time (user + system, from /proc) per request with
  an unthrottled engine and short replies, next to the engine's own, which does not depend on how
  busy the machine is the way wall-clock numbers do;
- with an unthrottled engine and long replies, the SSE events/s the gateway relays (and its CPU
  per event).

    python tests/bench/gateway_bench.py [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "runtime"), str(REPO)]

from tests.fakes.scripted_engine import Script, ScriptedEngine, free_port  # noqa: E402

CORES = sorted(os.sched_getaffinity(0))  # before any pinning narrows this process's own set
MARKER = b'"content":"tok"'
BODY = json.dumps({"model": "fake", "messages": [{"role": "user", "content": "x"}], "stream": True}).encode()


def serve_engine(port: int, pace_s: float, tokens: int) -> None:
    """Child process: the synthetic engine."""
    import uvicorn

    engine = ScriptedEngine(Script(content=["tok"] * tokens, pace_s=pace_s))
    uvicorn.run(engine, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def start(args: list[str]) -> subprocess.Popen[bytes]:
    paths = [str(REPO / "runtime"), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}

    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_ready(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up") from None
            time.sleep(0.05)


async def one_stream(port: int) -> tuple[float, int, float]:
    """One streamed chat request: (seconds to the first content token, content events, tokens/s
    from the first content token to the last)."""
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(BODY)}\r\nconnection: close\r\n\r\n"
    ).encode()
    writer.write(head + BODY)
    first: float | None = None
    last = 0.0
    events = 0
    tail = b""
    while True:
        data = await reader.read(65536)
        if not data:
            break
        window = tail + data  # a marker may straddle two reads; count each one once
        count = window.count(MARKER) - tail.count(MARKER)
        if count:
            last = time.perf_counter() - started
            if first is None:
                first = last
        events += count
        tail = window[-len(MARKER) :]
        if b"data: [DONE]" in window:
            break
    writer.close()
    if first is None:
        return float("nan"), 0, 0.0
    return first, events, (events - 1) / (last - first) if last > first else 0.0


async def load(port: int, streams: int) -> dict[str, Any]:
    started = time.perf_counter()
    results = await asyncio.gather(*(one_stream(port) for _ in range(streams)))
    elapsed = time.perf_counter() - started
    events = sum(n for _, n, _ in results)
    return {
        "ttft_ms": [t * 1000 for t, _, _ in results],
        "tokens": events,
        "tokens_per_s": sum(rate for _, _, rate in results),  # streamed: first token to last, summed
        "e2e_tokens_per_s": events / elapsed,  # wall clock of the whole batch, arrivals included
    }


def gateway_config(engine_port: int, port: int, directory: Path) -> Path:
    path = directory / "bench.toml"
    path.write_text(
        f'[engine]\nmodel = "fake"\nserved_name = "fake"\nport = {engine_port}\n'
        "context = 8192\nmax_tokens = 256\n"
        f'[api]\nhost = "127.0.0.1"\nport = {port}\nparallel = 256\nmax_queued = 256\nkeepalive_s = 15\n'
    )
    return path


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (Linux /proc), NaN where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pin(pids: dict[str, int], gateway_alone: bool) -> dict[str, list[int]]:
    """The client and the engine on all allowed cores but the last; the gateway on that last one
    alone, or (``gateway_alone`` false) free to use any. What was set, by name."""
    if len(CORES) < 2:
        return {}
    placed = {name: CORES[:-1] for name in pids}
    placed["gateway"] = CORES[-1:] if gateway_alone else CORES
    for name, pid in pids.items():
        os.sched_setaffinity(pid, placed[name])
    return placed


class Pair:
    """An engine server and a gateway in front of it, started for one phase of the run."""

    def __init__(self, pace_s: float, tokens: int, *, pinned: str) -> None:
        self.engine_port, self.gateway_port = free_port(), free_port()
        self.reply_s = pace_s * tokens  # how long one paced reply streams
        self._tmp = tempfile.TemporaryDirectory()
        config = gateway_config(self.engine_port, self.gateway_port, Path(self._tmp.name))
        cli = "from sparkfold.cli import main; main()"
        self.engine = start(
            [sys.executable, __file__, "--engine", str(self.engine_port), str(pace_s), str(tokens)]
        )
        self.gateway = start([sys.executable, "-c", cli, "api", "--config", str(config)])
        self.placement: dict[str, list[int]] = {}
        if pinned != "none":
            pids = {"client": os.getpid(), "engine": self.engine.pid, "gateway": self.gateway.pid}
            self.placement = pin(pids, gateway_alone=pinned == "gateway-alone")

    def __enter__(self) -> Pair:
        try:
            wait_ready(f"http://127.0.0.1:{self.engine_port}/health")
            wait_ready(f"http://127.0.0.1:{self.gateway_port}/health")
            asyncio.run(load(self.gateway_port, 2))  # warm both paths
            asyncio.run(load(self.engine_port, 2))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in (self.gateway, self.engine):
            proc.terminate()
            proc.wait(timeout=15)
        self._tmp.cleanup()


def ttft_row(streams: int, straight: list[float], through: list[float]) -> dict[str, Any]:
    """Median TTFTs of both sides (ms) and what the gateway adds; printed as it is made."""
    s_ttft, g_ttft = statistics.median(straight), statistics.median(through)
    row = {
        "streams": streams,
        "samples": len(through),
        "ttft_straight_ms": round(s_ttft, 3),
        "ttft_gateway_ms": round(g_ttft, 3),
        "ttft_added_ms": round(g_ttft - s_ttft, 3),
    }
    print(json.dumps(row), flush=True)
    return row


def ttft_phase(pair: Pair, concurrencies: list[int], rounds: int) -> list[dict[str, Any]]:
    """Many short rounds per concurrency, interleaved; TTFT pooled over every stream of every round."""
    rows = []
    for streams in concurrencies:
        straight: list[float] = []
        through: list[float] = []
        for _ in range(max(6, rounds // streams)):  # interleaved, so drift hits both sides alike
            straight += asyncio.run(load(pair.engine_port, streams))["ttft_ms"]
            through += asyncio.run(load(pair.gateway_port, streams))["ttft_ms"]
        rows.append(ttft_row(streams, straight, through))
    return rows


def steady_phase(pair: Pair, concurrencies: list[int], replies: int) -> list[dict[str, Any]]:
    """TTFT with N streams always running and requests arriving spread out (closed loop, staggered)."""
    rows = []
    for streams in concurrencies:
        per_client = max(3, replies // streams)
        straight, through = [], []
        for _ in range(2):  # interleaved, so drift hits both sides alike
            straight += asyncio.run(_staggered(pair.engine_port, streams, per_client, pair.reply_s))
            through += asyncio.run(_staggered(pair.gateway_port, streams, per_client, pair.reply_s))
        rows.append(ttft_row(streams, straight, through))
    return rows


async def _staggered(port: int, streams: int, per_client: int, reply_s: float) -> list[float]:
    """``streams`` clients, each sending ``per_client`` requests back to back, the first ones spread
    evenly over one reply's length; the TTFTs in ms."""

    async def client(index: int) -> list[float]:
        await asyncio.sleep(index * reply_s / streams)
        return [(await one_stream(port))[0] * 1000 for _ in range(per_client)]

    return [t for times in await asyncio.gather(*(client(i) for i in range(streams))) for t in times]


def rate_phase(pair: Pair, concurrencies: list[int], repeats: int) -> list[dict[str, Any]]:
    """Full-length streams: aggregate tokens/s straight and through the gateway, medians of rounds."""
    rows = []
    for streams in concurrencies:
        straight, through = [], []
        busy = []  # the gateway's CPU seconds per second of its rounds: 1.0 is one core saturated
        for _ in range(repeats):  # interleaved, so drift hits both sides alike
            straight.append(asyncio.run(load(pair.engine_port, streams)))
            cpu, wall = cpu_seconds(pair.gateway.pid), time.perf_counter()
            through.append(asyncio.run(load(pair.gateway_port, streams)))
            busy.append((cpu_seconds(pair.gateway.pid) - cpu) / (time.perf_counter() - wall))

        def median(side: list[dict[str, Any]], key: str) -> float:
            return statistics.median(r[key] for r in side)

        s_rate, g_rate = median(straight, "tokens_per_s"), median(through, "tokens_per_s")
        s_e2e, g_e2e = median(straight, "e2e_tokens_per_s"), median(through, "e2e_tokens_per_s")
        rows.append(
            {
                "streams": streams,
                "tok_s_straight": round(s_e2e, 1),
                "tok_s_gateway": round(g_e2e, 1),
                "tok_s_ratio": round(g_e2e / s_e2e, 4),
                "per_stream_ratio": round(g_rate / s_rate, 4),
                "gateway_cores_busy": round(statistics.median(busy), 3),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


async def _closed_loop(port: int, requests: int, streams: int) -> list[tuple[float, int, float]]:
    gate = asyncio.Semaphore(streams)

    async def one() -> tuple[float, int, float]:
        async with gate:
            return await one_stream(port)

    return await asyncio.gather(*(one() for _ in range(requests)))


def cost_phase(pair: Pair, requests: int, streams: int, tokens: int) -> dict[str, Any]:
    """CPU seconds each server spends per request (short replies, ``streams`` at a time)."""
    result: dict[str, Any] = {"requests": requests, "streams": streams, "tokens": tokens}
    for side, port in (("straight", pair.engine_port), ("gateway", pair.gateway_port)):
        before = {
            name: cpu_seconds(p.pid) for name, p in (("engine", pair.engine), ("gateway", pair.gateway))
        }
        replies = asyncio.run(_closed_loop(port, requests, streams))
        if any(events != tokens for _, events, _ in replies):
            raise RuntimeError(f"{side}: a reply was cut short")
        for name, proc in (("engine", pair.engine), ("gateway", pair.gateway)):
            if side == "straight" and name == "gateway":
                continue
            spent = cpu_seconds(proc.pid) - before[name]
            result[f"{name}_cpu_ms_per_request_{side}"] = round(spent / requests * 1000, 3)
    print(json.dumps(result), flush=True)
    return result


def flood_phase(pair: Pair, streams: int) -> dict[str, Any]:
    """Unthrottled engine: SSE events/s straight and relayed, and the gateway's CPU per event."""
    straight = asyncio.run(load(pair.engine_port, streams))
    before = cpu_seconds(pair.gateway.pid)
    through = asyncio.run(load(pair.gateway_port, streams))
    spent = cpu_seconds(pair.gateway.pid) - before
    result = {
        "streams": streams,
        "events_per_s_straight": round(straight["e2e_tokens_per_s"], 1),
        "events_per_s_gateway": round(through["e2e_tokens_per_s"], 1),
        "gateway_cpu_us_per_event": round(spent / through["tokens"] * 1e6, 2),
    }
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--engine":
        serve_engine(int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pace-tokens", type=int, default=300, help="tokens per paced stream (100 tok/s)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved tok/s rounds per concurrency")
    parser.add_argument("--ttft-tokens", type=int, default=30, help="tokens per stream in the TTFT rounds")
    parser.add_argument(
        "--ttft-rounds", type=int, default=60, help="TTFT rounds at 1 stream (fewer at more, at least 6)"
    )
    parser.add_argument("--cost-requests", type=int, default=1000, help="requests per side, CPU phase")
    parser.add_argument("--flood-tokens", type=int, default=20000, help="tokens per unthrottled stream")
    parser.add_argument("--flood-streams", type=int, default=8, help="concurrent unthrottled streams")
    parser.add_argument(
        "--pin",
        choices=["none", "others", "gateway-alone"],
        default="others" if len(CORES) >= 2 else "none",
        help="others: client and engine kept off the last core, the gateway free; gateway-alone: the "
        "gateway on the last core only; none: the scheduler decides",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so a stopped run still stops its servers
    concurrencies = [1, 4, 16, 64]
    result: dict[str, Any] = {"cpus": CORES, "pinned": args.pin}
    print("paced upstream, 100 tokens/s per stream: TTFT", flush=True)
    with Pair(0.01, args.ttft_tokens, pinned=args.pin) as pair:
        result["placement"] = pair.placement
        result["ttft"] = ttft_phase(pair, concurrencies, args.ttft_rounds)
        print("paced upstream, 100 tokens/s per stream: TTFT in a steady state", flush=True)
        result["ttft_steady"] = steady_phase(pair, concurrencies, args.ttft_rounds)
    print("paced upstream, 100 tokens/s per stream: tok/s", flush=True)
    with Pair(0.01, args.pace_tokens, pinned=args.pin) as pair:
        result["rate"] = rate_phase(pair, concurrencies, args.repeats)
    print("unthrottled upstream, 5-token replies: CPU per request", flush=True)
    with Pair(0.0, 5, pinned=args.pin) as pair:
        result["cost"] = cost_phase(pair, args.cost_requests, 8, 5)
    print("unthrottled upstream: relay rate", flush=True)
    with Pair(0.0, args.flood_tokens, pinned=args.pin) as pair:
        result["unthrottled"] = flood_phase(pair, args.flood_streams)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
