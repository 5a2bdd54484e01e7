"""Gateway overhead: the same streamed load sent straight to an engine server and through the gateway.

Three processes: a synthetic engine (the scripted engine double, streaming at a fixed pace), the
gateway (`sparkfold api`: one process, one event-loop thread, so one core at most), and this load
generator (a raw-socket SSE client, cheap enough not to be the bottleneck). In one run it measures,
at each concurrency:

- the median time to the first content token, straight and through the gateway (added = the difference),
- the aggregate streamed tokens/s (each stream's rate from its first token to its last, summed),
  straight and through the gateway (ratio = through / straight);

and, with an unthrottled engine, the SSE events/s the gateway relays (its one core saturated).

    python tests/bench/gateway_bench.py [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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


async def load(port: int, streams: int) -> dict[str, float]:
    started = time.perf_counter()
    results = await asyncio.gather(*(one_stream(port) for _ in range(streams)))
    elapsed = time.perf_counter() - started
    events = sum(n for _, n, _ in results)
    return {
        "ttft_median_ms": statistics.median(t for t, _, _ in results) * 1000,
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


def run_pair(pace_s: float, tokens: int, concurrencies: list[int], repeats: int) -> list[dict[str, Any]]:
    engine_port, gateway_port = free_port(), free_port()
    me = [sys.executable, __file__]
    procs = [start([*me, "--engine", str(engine_port), str(pace_s), str(tokens)])]
    with tempfile.TemporaryDirectory() as tmp:
        config = gateway_config(engine_port, gateway_port, Path(tmp))
        cli = "from sparkfold.cli import main; main()"
        procs.append(start([sys.executable, "-c", cli, "api", "--config", str(config)]))
        try:
            wait_ready(f"http://127.0.0.1:{engine_port}/health")
            wait_ready(f"http://127.0.0.1:{gateway_port}/health")
            asyncio.run(load(gateway_port, 2))  # warm both paths
            asyncio.run(load(engine_port, 2))
            rows = []
            for streams in concurrencies:
                straight, through = [], []
                for _ in range(repeats):  # interleaved, so drift hits both sides alike
                    straight.append(asyncio.run(load(engine_port, streams)))
                    through.append(asyncio.run(load(gateway_port, streams)))
                s_ttft = statistics.median(r["ttft_median_ms"] for r in straight)
                g_ttft = statistics.median(r["ttft_median_ms"] for r in through)
                s_rate = statistics.median(r["tokens_per_s"] for r in straight)
                g_rate = statistics.median(r["tokens_per_s"] for r in through)
                s_e2e = statistics.median(r["e2e_tokens_per_s"] for r in straight)
                g_e2e = statistics.median(r["e2e_tokens_per_s"] for r in through)
                rows.append(
                    {
                        "streams": streams,
                        "ttft_straight_ms": round(s_ttft, 3),
                        "ttft_gateway_ms": round(g_ttft, 3),
                        "ttft_added_ms": round(g_ttft - s_ttft, 3),
                        "tok_s_straight": round(s_rate, 1),
                        "tok_s_gateway": round(g_rate, 1),
                        "tok_s_ratio": round(g_rate / s_rate, 4),
                        "e2e_tok_s_straight": round(s_e2e, 1),
                        "e2e_tok_s_gateway": round(g_e2e, 1),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
            return rows
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=15)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--engine":
        serve_engine(int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pace-tokens", type=int, default=300, help="tokens per paced stream (100 tok/s)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs per concurrency")
    parser.add_argument("--flood-tokens", type=int, default=20000, help="tokens per unthrottled stream")
    parser.add_argument("--flood-streams", type=int, default=8, help="concurrent unthrottled streams")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    print("paced upstream, 100 tokens/s per stream:", flush=True)
    paced = run_pair(0.01, args.pace_tokens, [1, 4, 16, 64], args.repeats)
    print("unthrottled upstream:", flush=True)
    flood = run_pair(0.0, args.flood_tokens, [args.flood_streams], 1)[0]
    result = {
        "paced": paced,
        "unthrottled": {
            "streams": args.flood_streams,
            "events_per_s_straight": flood["e2e_tok_s_straight"],
            "events_per_s_gateway": flood["e2e_tok_s_gateway"],
        },
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result["unthrottled"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
