"""Gateway overhead: the same streamed load sent straight to an engine server, through the gateway,
and (with ``--litellm``) through LiteLLM's proxy, in one run.

Processes: a synthetic engine (the scripted engine double, streaming at a fixed pace), the
gateway (`sparkfold api`: one process, one event-loop thread, so one core at most), LiteLLM's
proxy in front of the same engine (``litellm --config … --num_workers 1``: one process, its
defaults otherwise, a master key as it requires), and this load generator (a raw-socket SSE
client, cheap enough not to be the bottleneck). Every round sends the same load to each side in
turn (straight, gateway, LiteLLM), so drift on the machine hits all of them alike. With ``--pin`` (the
default on two or more cores) the gateway gets the last allowed core to itself and the engine and
the client share the others, so the straight and gateway sides see the same engine and client
and the gateway never queues behind them. In one run it measures:

- *TTFT*: request sent to the first content token, straight and through each proxy (added = the
  difference of the medians; p25 and p75 of the pooled samples show the spread), pooled over
  many short rounds at 1, 4, 16 and 64 simultaneous streams (a burst: every
  stream of a round sent at the same moment), and in a steady state (each of N clients sends its
  next request when its previous reply ends, the clients' first requests spread over one reply's
  length, so N streams run at all times and requests arrive one by one);
- *tok/s*: the aggregate streamed tokens/s at each concurrency (ratio = through / straight; the
  lowest and highest round's ratio beside the median);
- *CPU per request*: each proxy's CPU time (user + system of its process and any children, from
  /proc) per request with an unthrottled engine and short replies, next to the engine's own, in
  interleaved chunks (median, lowest, highest); it does not depend on how busy the machine is
  the way wall-clock numbers do;
- with an unthrottled engine and long replies, the SSE events/s the gateway relays (and its CPU
  per event).

    python tests/bench/gateway_bench.py [--json FILE] [--litellm PATH/TO/litellm]

LiteLLM is not a dependency: install it apart (``python -m venv /opt/ll && /opt/ll/bin/pip install
'litellm[proxy]'``) and pass its ``litellm`` executable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
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
MARKERS = (b'"content":"tok"', b'"content": "tok"')  # compact JSON (ours), spaced (LiteLLM's)
BODY = json.dumps({"model": "fake", "messages": [{"role": "user", "content": "x"}], "stream": True}).encode()
LITELLM_KEY = "sk-sparkfold-bench-7f3a9c2e51d84b06"  # LiteLLM refuses to start without a master key
READY_S = 120  # a loaded machine imports FastAPI and pydantic slowly; a process that exits fails at once
LITELLM_READY_S = 300  # it imports a lot: about 30 s on a quiet core, minutes on a loaded one


def serve_engine(port: int, pace_s: float, tokens: int) -> None:
    """Child process: the synthetic engine."""
    import uvicorn

    engine = ScriptedEngine(Script(content=["tok"] * tokens, pace_s=pace_s))
    uvicorn.run(engine, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    paths = [str(REPO / "runtime"), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    full = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **(env or {})}
    return subprocess.Popen(args, env=full, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_ready(url: str, timeout: float = 30, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
                raise RuntimeError(f"{url} did not come up") from None
            time.sleep(0.05)


async def one_stream(port: int) -> tuple[float, int, float]:
    """One streamed chat request: (seconds to the first content token, content events, tokens/s
    from the first content token to the last)."""
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(BODY)}\r\nauthorization: Bearer {LITELLM_KEY}\r\nconnection: close\r\n\r\n"
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
        count = sum(window.count(m) - tail.count(m) for m in MARKERS)
        if count:
            last = time.perf_counter() - started
            if first is None:
                first = last
        events += count
        tail = window[-max(map(len, MARKERS)) :]
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
        "context = 8192\nmax_tokens = 256\nparallel = 64\n"  # the gateway's lanes may not exceed it
        f'[api]\nhost = "127.0.0.1"\nport = {port}\nparallel = 64\nmax_queued = 256\nkeepalive_s = 15\n'
    )
    return path


def _children(pid: int) -> list[int]:
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        return [int(c) for task in tasks for c in (task / "children").read_text().split()]
    except OSError:
        return []


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` and its live descendants so far (Linux /proc),
    NaN where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return own + sum(cpu_seconds(child) for child in _children(pid))


def pin(pids: dict[str, int], proxies_free: bool) -> dict[str, list[int]]:
    """The client and the engine on all allowed cores but the last; each proxy on that last one
    alone, or (``proxies_free``) free to use any. What was set, by name."""
    if len(CORES) < 2:
        return {}
    placed = {
        name: CORES[:-1] if name in ("client", "engine") else (CORES if proxies_free else CORES[-1:])
        for name in pids
    }
    for name, pid in pids.items():
        os.sched_setaffinity(pid, placed[name])
    return placed


def litellm_config(engine_port: int, directory: Path) -> Path:
    path = directory / "litellm.yaml"
    path.write_text(
        "model_list:\n  - model_name: fake\n    litellm_params:\n      model: openai/fake\n"
        f"      api_base: http://127.0.0.1:{engine_port}/v1\n      api_key: unused\n"
        f"general_settings:\n  master_key: {LITELLM_KEY}\n"
    )
    return path


class Pair:
    """An engine server with the gateway (and LiteLLM's proxy, when given) in front, for one phase."""

    def __init__(self, pace_s: float, tokens: int, *, pinned: str, litellm: str | None) -> None:
        self.engine_port, self.gateway_port = free_port(), free_port()
        self.reply_s = pace_s * tokens  # how long one paced reply streams
        self._tmp = tempfile.TemporaryDirectory()
        config = gateway_config(self.engine_port, self.gateway_port, Path(self._tmp.name))
        cli = "from sparkfold.cli import main; main()"
        self.engine = start(
            [sys.executable, __file__, "--engine", str(self.engine_port), str(pace_s), str(tokens)]
        )
        self.gateway = start([sys.executable, "-c", cli, "api", "--config", str(config)])
        self.proxies: dict[str, tuple[int, subprocess.Popen[bytes]]] = {
            "gateway": (self.gateway_port, self.gateway)
        }
        if litellm:
            port = free_port()
            args = [litellm, "--config", str(litellm_config(self.engine_port, Path(self._tmp.name)))]
            args += ["--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
            # the packaged model cost map, not a download at start (there is no network here)
            self.proxies["litellm"] = (port, start(args, env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"}))
        self.placement: dict[str, list[int]] = {}
        if pinned != "none":
            pids = {"client": os.getpid(), "engine": self.engine.pid}
            pids |= {name: proc.pid for name, (_, proc) in self.proxies.items()}
            self.placement = pin(pids, proxies_free=pinned == "others")

    def sides(self) -> dict[str, int]:
        """Every side's port: straight first, then each proxy."""
        return {"straight": self.engine_port} | {name: port for name, (port, _) in self.proxies.items()}

    def __enter__(self) -> Pair:
        try:
            wait_ready(f"http://127.0.0.1:{self.engine_port}/health", READY_S, self.engine)
            wait_ready(f"http://127.0.0.1:{self.gateway_port}/health", READY_S, self.gateway)
            if "litellm" in self.proxies:
                port, proc = self.proxies["litellm"]
                wait_ready(f"http://127.0.0.1:{port}/health/liveliness", LITELLM_READY_S, proc)
            for port in self.sides().values():  # warm every path
                asyncio.run(load(port, 2))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        procs = [proc for _, proc in self.proxies.values()] + [self.engine]
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
        self._tmp.cleanup()


def _q(values: list[float], q: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]
        if len(values) > 1
        else values[0]
    )


def ttft_row(streams: int, samples: dict[str, list[float]]) -> dict[str, Any]:
    """Median TTFT of every side (ms), p25 / p75, and what each proxy adds; printed as it is made."""
    medians = {side: statistics.median(values) for side, values in samples.items()}
    row: dict[str, Any] = {"streams": streams, "samples": len(samples["straight"])}
    for side, values in samples.items():
        row[f"ttft_{side}_ms"] = round(medians[side], 3)
        row[f"ttft_{side}_p25_p75_ms"] = [round(_q(values, 0.25), 3), round(_q(values, 0.75), 3)]
        if side != "straight":
            row[f"ttft_added_{side}_ms"] = round(medians[side] - medians["straight"], 3)
    print(json.dumps(row), flush=True)
    return row


def ttft_phase(pair: Pair, concurrencies: list[int], rounds: int) -> list[dict[str, Any]]:
    """Many short rounds per concurrency, interleaved; TTFT pooled over every stream of every round."""
    rows = []
    for streams in concurrencies:
        samples: dict[str, list[float]] = {side: [] for side in pair.sides()}
        for _ in range(max(6, rounds // streams)):  # interleaved, so drift hits every side alike
            for side, port in pair.sides().items():
                samples[side] += asyncio.run(load(port, streams))["ttft_ms"]
        rows.append(ttft_row(streams, samples))
    return rows


def steady_phase(pair: Pair, concurrencies: list[int], replies: int) -> list[dict[str, Any]]:
    """TTFT with N streams always running and requests arriving spread out (closed loop, staggered)."""
    rows = []
    for streams in concurrencies:
        per_client = max(3, replies // streams)
        samples: dict[str, list[float]] = {side: [] for side in pair.sides()}
        for _ in range(2):  # interleaved, so drift hits every side alike
            for side, port in pair.sides().items():
                samples[side] += asyncio.run(_staggered(port, streams, per_client, pair.reply_s))
        rows.append(ttft_row(streams, samples))
    return rows


async def _staggered(port: int, streams: int, per_client: int, reply_s: float) -> list[float]:
    """``streams`` clients, each sending ``per_client`` requests back to back, the first ones spread
    evenly over one reply's length; the TTFTs in ms."""

    async def client(index: int) -> list[float]:
        await asyncio.sleep(index * reply_s / streams)
        return [(await one_stream(port))[0] * 1000 for _ in range(per_client)]

    return [t for times in await asyncio.gather(*(client(i) for i in range(streams))) for t in times]


def rate_phase(pair: Pair, concurrencies: list[int], repeats: int) -> list[dict[str, Any]]:
    """Full-length streams: aggregate tokens/s on every side, medians of interleaved rounds."""
    rows = []
    for streams in concurrencies:
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in pair.sides()}
        busy: dict[str, list[float]] = {name: [] for name in pair.proxies}  # CPU s per s: 1.0 = one core
        for _ in range(repeats):  # interleaved, so drift hits every side alike
            for side, port in pair.sides().items():
                proc = pair.proxies[side][1] if side in pair.proxies else None
                cpu, wall = (cpu_seconds(proc.pid) if proc else 0.0), time.perf_counter()
                runs[side].append(asyncio.run(load(port, streams)))
                if proc:
                    busy[side].append((cpu_seconds(proc.pid) - cpu) / (time.perf_counter() - wall))
        straight = runs["straight"]
        row: dict[str, Any] = {
            "streams": streams,
            "tok_s_straight": round(statistics.median(r["e2e_tokens_per_s"] for r in straight), 1),
        }
        for name in pair.proxies:
            ratios = [
                g["e2e_tokens_per_s"] / s["e2e_tokens_per_s"]
                for g, s in zip(runs[name], straight, strict=True)
            ]
            per_stream = statistics.median(r["tokens_per_s"] for r in runs[name]) / statistics.median(
                r["tokens_per_s"] for r in straight
            )
            row |= {
                f"tok_s_{name}": round(statistics.median(r["e2e_tokens_per_s"] for r in runs[name]), 1),
                f"tok_s_ratio_{name}": round(statistics.median(ratios), 4),
                f"tok_s_ratio_{name}_min_max": [round(min(ratios), 4), round(max(ratios), 4)],
                f"per_stream_ratio_{name}": round(per_stream, 4),
                f"{name}_cores_busy": round(statistics.median(busy[name]), 3),
            }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


async def _closed_loop(port: int, requests: int, streams: int) -> list[tuple[float, int, float]]:
    gate = asyncio.Semaphore(streams)

    async def one() -> tuple[float, int, float]:
        async with gate:
            return await one_stream(port)

    return await asyncio.gather(*(one() for _ in range(requests)))


def cost_phase(pair: Pair, requests: int, streams: int, tokens: int, chunks: int = 3) -> dict[str, Any]:
    """CPU milliseconds each server spends per request (short replies, ``streams`` at a time), in
    ``chunks`` interleaved chunks per side: median, lowest, highest."""
    per_chunk = max(1, requests // chunks)
    spent: dict[str, list[float]] = {}
    for _ in range(chunks):
        for side, port in pair.sides().items():
            procs = {"engine": pair.engine} | ({side: pair.proxies[side][1]} if side in pair.proxies else {})
            before = {name: cpu_seconds(p.pid) for name, p in procs.items()}
            replies = asyncio.run(_closed_loop(port, per_chunk, streams))
            if any(events != tokens for _, events, _ in replies):
                raise RuntimeError(f"{side}: a reply was cut short")
            for name, proc in procs.items():
                key = f"{name}_cpu_ms_per_request" + ("" if name == side else f"_{side}")
                spent.setdefault(key, []).append((cpu_seconds(proc.pid) - before[name]) / per_chunk * 1000)
    result: dict[str, Any] = {"requests": per_chunk * chunks, "streams": streams, "tokens": tokens}
    for key, values in spent.items():
        result[key] = round(statistics.median(values), 3)
        result[key + "_min_max"] = [round(min(values), 3), round(max(values), 3)]
    print(json.dumps(result), flush=True)
    return result


def flood_phase(pair: Pair, streams: int) -> dict[str, Any]:
    """Unthrottled engine: SSE events/s straight and through each proxy, and its CPU per event."""
    result: dict[str, Any] = {"streams": streams}
    for side, port in pair.sides().items():
        proc = pair.proxies[side][1] if side in pair.proxies else None
        before = cpu_seconds(proc.pid) if proc else 0.0
        through = asyncio.run(load(port, streams))
        result[f"events_per_s_{side}"] = round(through["e2e_tokens_per_s"], 1)
        if proc:
            cpu = cpu_seconds(proc.pid) - before
            result[f"{side}_cpu_us_per_event"] = round(cpu / max(through["tokens"], 1) * 1e6, 2)
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
    parser.add_argument("--levels", default="1,4,16,64", help="concurrencies of the TTFT and tok/s phases")
    parser.add_argument(
        "--litellm",
        default=os.environ.get("LITELLM") or shutil.which("litellm"),
        help="LiteLLM's `litellm` executable: adds its proxy as a third side (default: $LITELLM, or on PATH)",
    )
    parser.add_argument(
        "--pin",
        choices=["none", "others", "gateway-alone"],
        default="others" if len(CORES) >= 2 else "none",
        help="others: client and engine kept off the last core, the proxies free; gateway-alone: each "
        "proxy on the last core only; none: the scheduler decides",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so a stopped run still stops its servers
    concurrencies = [int(n) for n in args.levels.split(",")]
    result: dict[str, Any] = {"cpus": CORES, "pinned": args.pin, "litellm": args.litellm}
    if not args.litellm:
        print("LiteLLM not found (--litellm PATH): measuring straight and the gateway only", flush=True)
    phase = {"pinned": args.pin, "litellm": args.litellm}
    print("paced upstream, 100 tokens/s per stream: TTFT", flush=True)
    with Pair(0.01, args.ttft_tokens, **phase) as pair:
        result["placement"] = pair.placement
        result["ttft"] = ttft_phase(pair, concurrencies, args.ttft_rounds)
        print("paced upstream, 100 tokens/s per stream: TTFT in a steady state", flush=True)
        result["ttft_steady"] = steady_phase(pair, concurrencies, args.ttft_rounds)
    print("paced upstream, 100 tokens/s per stream: tok/s", flush=True)
    with Pair(0.01, args.pace_tokens, **phase) as pair:
        result["rate"] = rate_phase(pair, concurrencies, args.repeats)
    print("unthrottled upstream, 5-token replies: CPU per request", flush=True)
    with Pair(0.0, 5, **phase) as pair:
        result["cost"] = cost_phase(pair, args.cost_requests, 8, 5)
    print("unthrottled upstream: relay rate", flush=True)
    with Pair(0.0, args.flood_tokens, **phase) as pair:
        result["unthrottled"] = flood_phase(pair, args.flood_streams)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
