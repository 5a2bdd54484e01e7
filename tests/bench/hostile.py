"""Hostile load against a real gateway process: fuzzing, connection flood, amplification, a soak.

Commands, not timed tests: each prints one JSON report (``docs/reliability.md`` records them).
The gateway runs as ``sparkfold api`` (its own process, its default limits unless a flag says
otherwise) in front of the scripted engine (in this process, on a thread) or ``--engine-url``
(any engine server, e.g. ``sparkfold engine`` with the demo model). Every loop is bounded in count
and in time.

    python tests/bench/hostile.py fuzz  [--cases 1000] [--engine-url URL]
    python tests/bench/hostile.py flood [--connections 1100]
    python tests/bench/hostile.py persist [--connections 2100] [--hold-s 30]
    python tests/bench/hostile.py amplify [--mib 40] [--bodies 4]
    python tests/bench/hostile.py soak  [--requests 3000]

fuzz: schemathesis builds requests (valid and invalid, the wrong JSON types included) from the
gateway's own ``/openapi.json`` for every operation; per operation it reports cases, 2xx / 4xx /
5xx, hangs (no answer within ``--timeout-s``) and crashes (the gateway process gone).
flood / amplify: a well-behaved client's latency (p50 / p99 of a short chat completion) and the
gateway's memory (RSS) and descriptors, before and during the attack.
soak: RSS, descriptors, lanes and queue (``/health`` with a key) before and after a mixed load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(1, str(Path(__file__).resolve().parents[2] / "runtime"))

from tests.fakes.conn_flood import Flood
from tests.fakes.scripted_engine import Script, ScriptedEngine, ServerThread, free_port

KEY = "hostile-bench-key"
CHAT = {"model": "fake", "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]}


class Gateway:
    """``sparkfold api`` as a child process; ``url``, ``process`` and its psutil view."""

    def __init__(self, engine_port: int, folder: Path, *, nofile: int | None = None, **api: object) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        keys = folder / "api-keys"
        keys.write_text(KEY + "\n")
        settings = {"host": "127.0.0.1", "port": self.port, "api_keys_file": str(keys), **api}
        lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in settings.items())
        config = folder / "sparkfold.toml"
        config.write_text(
            f'[engine]\nmodel = "x"\nserved_name = "fake"\nport = {engine_port}\n[api]\n{lines}\n'
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.log = (folder / "gateway.log").open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from sparkfold.cli import main; main()", "api", "--config", str(config)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.log,
            preexec_fn=None
            if nofile is None
            else lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile)),
        )
        self.ps = psutil.Process(self.process.pid)
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(self.url + "/health", timeout=1)
                return
            except httpx.TransportError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the gateway did not start; see its log") from None
                time.sleep(0.05)

    def alive(self) -> bool:
        return self.process.poll() is None

    def resources(self) -> dict[str, Any]:
        with contextlib.suppress(psutil.Error):
            return {"rss_mib": round(self.ps.memory_info().rss / 2**20, 1), "fds": self.ps.num_fds()}
        return {"rss_mib": None, "fds": None}

    def stop(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.log.close()


@contextlib.contextmanager
def running(args: argparse.Namespace, **api: object) -> Iterator[tuple[Gateway, ScriptedEngine | None]]:
    with tempfile.TemporaryDirectory() as folder, contextlib.ExitStack() as stack:
        fake: ScriptedEngine | None = None
        if args.engine_url:
            port = int(args.engine_url.rsplit(":", 1)[1].split("/")[0])
        else:
            fake = ScriptedEngine(Script(content=["Hi", "!"]))
            port = stack.enter_context(ServerThread(fake)).port
        gateway = Gateway(port, Path(folder), nofile=getattr(args, "nofile", None), **api)
        try:
            yield gateway, fake
        finally:
            gateway.stop()


def headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


class Probe:
    """A well-behaved client on its own thread: one short chat completion after another (from
    ``source``, each on a fresh connection, when it is given)."""

    def __init__(self, url: str, source: str | None = None) -> None:
        self.url = url
        self.source = source
        self.samples: list[tuple[float, float, int]] = []  # (sent at, seconds, status)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        transport = httpx.HTTPTransport(local_address=self.source) if self.source else None
        extra = {"connection": "close"} if self.source else {}
        with httpx.Client(base_url=self.url, timeout=60, headers=headers(), transport=transport) as http:
            while not self._stop.is_set() and len(self.samples) < 100_000:
                started = time.monotonic()
                try:
                    status = http.post("/v1/chat/completions", json=CHAT, headers=extra).status_code
                except httpx.HTTPError:
                    status = 0
                self.samples.append((started, time.monotonic() - started, status))
                self._stop.wait(0.05)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=90)

    def between(self, start: float, end: float) -> dict[str, Any]:
        window = [s for s in self.samples if start <= s[0] < end]
        times = sorted(s[1] for s in window)
        if not times:
            return {"requests": 0}
        return {
            "requests": len(times),
            "ok": sum(1 for s in window if s[2] == 200),
            "p50_ms": round(1000 * statistics.median(times), 1),
            "p99_ms": round(1000 * times[min(len(times) - 1, int(0.99 * len(times)))], 1),
        }


# --- fuzz ------------------------------------------------------------------------------------------


class _OutOfTime(BaseException):
    """Raised in a case past ``--budget-s``: a BaseException, so hypothesis stops without shrinking."""


def _fuzz_operation(
    operation: Any, http: httpx.Client, gateway: Gateway, args: argparse.Namespace, deadline: float
) -> dict[str, Any]:
    """Generated cases for one operation, valid then invalid, counted by outcome."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis.generation import GenerationMode

    counts: Counter[str] = Counter()
    samples: list[str] = []
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=args.cases // 2,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def exercise(case: schemathesis.Case) -> None:
            if not gateway.alive() or time.monotonic() > deadline:
                raise _OutOfTime
            kwargs = case.as_transport_kwargs(base_url=gateway.url)
            data = kwargs.get("data")
            try:
                response = http.request(
                    kwargs["method"],
                    kwargs["url"],
                    params=kwargs.get("params"),
                    headers={**(kwargs.get("headers") or {}), **headers()},
                    json=kwargs.get("json"),
                    content=data if isinstance(data, bytes | str) else None,
                )
            except httpx.LocalProtocolError:  # a generated header httpx will not send: nothing was sent
                return
            except httpx.TimeoutException:
                counts["hangs"] += 1
                return
            except httpx.TransportError:
                counts["crashes" if not gateway.alive() else "dropped"] += 1
                return
            counts["cases"] += 1
            counts[f"{response.status_code // 100}xx"] += 1
            if response.status_code >= 500 and len(samples) < 3:
                samples.append(f"{response.status_code} {response.text[:160]}")

        with contextlib.suppress(Unsatisfiable, _OutOfTime):  # Unsatisfiable: no invalid input exists
            exercise()
    report: dict[str, Any] = {k: counts.get(k, 0) for k in ("cases", "2xx", "4xx", "5xx", "hangs", "crashes")}
    if samples:
        report["5xx_samples"] = samples
    return report


def fuzz(args: argparse.Namespace) -> dict[str, Any]:
    import schemathesis

    report: dict[str, Any] = {}
    with running(args) as (gateway, _):
        schema = schemathesis.openapi.from_url(gateway.url + "/openapi.json")
        started = time.monotonic()
        with httpx.Client(base_url=gateway.url, timeout=args.timeout_s, headers=headers()) as http:
            for result in schema.get_all_operations():
                operation = result.ok()
                name = f"{operation.method.upper()} {operation.path}"
                report[name] = _fuzz_operation(operation, http, gateway, args, started + args.budget_s)
                print(name, json.dumps(report[name]), file=sys.stderr, flush=True)
        report["_alive_after"] = gateway.alive()
        report["_seconds"] = round(time.monotonic() - started, 1)
    return report


# --- flood -----------------------------------------------------------------------------------------


def flood(args: argparse.Namespace) -> dict[str, Any]:
    # 127.0.0.1 floods, 127.0.0.2 is the legitimate client (api.max_connections_per_client caps the
    # flood's own address: a probe sharing it would measure the cap, not the gateway's service)
    with running(args) as (gateway, _), Probe(gateway.url, source="127.0.0.2") as probe:
        time.sleep(args.phase_s)  # baseline samples
        before = gateway.resources()
        t0 = time.monotonic()
        sockets: list[socket.socket] = []
        refused = 0
        for _ in range(args.connections):
            try:
                sockets.append(socket.create_connection(("127.0.0.1", gateway.port), timeout=5))
            except OSError:
                refused += 1
        t1 = time.monotonic()
        time.sleep(args.phase_s)
        during = gateway.resources()
        t2 = time.monotonic()
        time.sleep(args.hold_s)  # past api.header_timeout_s: the gateway closes the silent ones
        open_after = 0
        for sock in sockets:
            sock.setblocking(False)
            try:
                open_after += sock.recv(1) != b""
            except BlockingIOError:
                open_after += 1
            except OSError:
                pass
        for sock in sockets:
            sock.close()
        return {
            "connections_opened": len(sockets),
            "connect_failures": refused,
            "still_open_after_s": {"seconds": round(time.monotonic() - t1, 1), "open": open_after},
            "gateway_after": gateway.resources(),
            "nofile_limit": gateway.ps.rlimit(psutil.RLIMIT_NOFILE)[0],
            "gateway_before": before,
            "gateway_during": during,
            "client_before": probe.between(0, t0),
            "client_during": probe.between(t0, t2),
            "flood_open_s": round(t1 - t0, 2),
        }


def persist(args: argparse.Namespace) -> dict[str, Any]:
    """The persistent flood: 127.0.0.1 holds ``--connections`` header-less connections, each
    re-opened as soon as the gateway closes it, for ``--hold-s``; 127.0.0.2 is the probe."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this driver holds the sockets
    api = {} if args.per_client is None else {"max_connections_per_client": args.per_client}
    with running(args, **api) as (gateway, _), Probe(gateway.url, source="127.0.0.2") as probe:
        time.sleep(args.phase_s)
        before = gateway.resources()
        t0 = time.monotonic()
        flood = Flood(gateway.port, args.connections, max_opens=100_000_000)
        flood.start()
        time.sleep(args.hold_s)
        during = gateway.resources()
        t1 = time.monotonic()
        flood.stop.set()
        flood.join(timeout=60)
        return {
            "flood_sockets": args.connections,
            "flood_opens": flood.opens,
            "flood_connect_failures": flood.connect_failures,
            "flood_answers": {k.decode() or "closed": v for k, v in flood.answers.items()},
            "flood_503_without_retry_after": flood.retry_after_missing,
            "client_before": probe.between(0, t0),
            "client_during": probe.between(t0, t1),
            "statuses_during": dict(Counter(s[2] for s in probe.samples if t0 <= s[0] < t1)),
            "gateway_before": before,
            "gateway_during": during,
            "nofile_limit": gateway.ps.rlimit(psutil.RLIMIT_NOFILE)[0],
            "seconds": round(t1 - t0, 1),
        }


# --- amplification ---------------------------------------------------------------------------------


def amplify(args: argparse.Namespace) -> dict[str, Any]:
    body = b'{"model": "fake", "messages": [{"role": "user", "content": "x"}], "tools": ['
    body += b"{}," * (args.mib * 2**20 // 3) + b"{}]}"
    statuses: Counter[int] = Counter()
    peak = {"rss_mib": 0.0}
    with running(args) as (gateway, _), Probe(gateway.url) as probe:
        time.sleep(args.phase_s)
        before = gateway.resources()
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(0.05):
                rss = gateway.resources()["rss_mib"] or 0.0
                peak["rss_mib"] = max(peak["rss_mib"], rss)

        def send() -> None:
            with httpx.Client(base_url=gateway.url, timeout=120, headers=headers()) as http:
                try:
                    statuses[
                        http.post(
                            "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
                        ).status_code
                    ] += 1
                except httpx.HTTPError:
                    statuses[0] += 1

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        t0 = time.monotonic()
        senders = [threading.Thread(target=send) for _ in range(args.bodies)]
        for thread in senders:
            thread.start()
        for thread in senders:
            thread.join(timeout=300)
        t1 = time.monotonic()
        stop.set()
        watcher.join(timeout=5)
        return {
            "body_mib": round(len(body) / 2**20, 1),
            "bodies": args.bodies,
            "statuses": dict(statuses),
            "gateway_before": before,
            "gateway_peak_rss_mib": peak["rss_mib"],
            "attack_s": round(t1 - t0, 2),
            "client_before": probe.between(0, t0),
            "client_during": probe.between(t0, t1),
        }


# --- soak ------------------------------------------------------------------------------------------


def soak(args: argparse.Namespace) -> dict[str, Any]:
    mixes: list[Callable[[httpx.Client], int]] = [
        lambda h: h.post("/v1/chat/completions", json=CHAT).status_code,
        lambda h: h.post("/v1/chat/completions", json={**CHAT, "stream": True}).status_code,
        lambda h: h.post("/v1/responses", json={"model": "fake", "input": "hi"}).status_code,
        lambda h: h.post("/v1/messages", json={**CHAT, "max_tokens": 8}).status_code,
        lambda h: h.post("/v1/chat/completions", json={**CHAT, "max_tokens": True}).status_code,
        lambda h: (
            h.post(
                "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
            ).status_code
        ),
    ]
    statuses: Counter[int] = Counter()
    with (
        running(args) as (gateway, _),
        httpx.Client(base_url=gateway.url, timeout=60, headers=headers()) as http,
    ):

        def state() -> dict[str, Any]:
            health = http.get("/health").json()
            return {**gateway.resources(), "lanes": health["lanes"], "queue": health["queue"]}

        for _ in range(50):  # warm up: first-use allocations are not a leak
            mixes[0](http)
        before = state()
        deadline = time.monotonic() + args.budget_s
        sent = 0
        while sent < args.requests and time.monotonic() < deadline:
            statuses[mixes[sent % len(mixes)](http)] += 1
            sent += 1
        after = state()
        return {"requests": sent, "statuses": dict(statuses), "before": before, "after": after}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["fuzz", "flood", "persist", "amplify", "soak"])
    parser.add_argument(
        "--engine-url", help="an engine server to put the gateway in front of (default: scripted)"
    )
    parser.add_argument("--cases", type=int, default=1000, help="fuzz: generated cases per operation")
    parser.add_argument(
        "--timeout-s", type=float, default=30, help="fuzz: a case with no answer by then is a hang"
    )
    parser.add_argument("--budget-s", type=float, default=1800, help="the longest the run may take")
    parser.add_argument(
        "--connections", type=int, default=1100, help="flood, persist: idle connections to open (hold)"
    )
    parser.add_argument("--phase-s", type=float, default=5, help="flood/amplify: seconds per measured phase")
    parser.add_argument(
        "--hold-s",
        type=float,
        default=8,
        help="flood: then this long before counting open ones; persist: flood this long",
    )
    parser.add_argument("--nofile", type=int, help="flood: the gateway's descriptor limit (ulimit -n)")
    parser.add_argument(
        "--per-client", type=int, help="persist: api.max_connections_per_client (default: the gateway's)"
    )
    parser.add_argument("--mib", type=int, default=40, help="amplify: MiB of each body of empty tools")
    parser.add_argument("--bodies", type=int, default=4, help="amplify: such bodies sent at once")
    parser.add_argument("--requests", type=int, default=3000, help="soak: requests in all")
    args = parser.parse_args()
    commands = {"fuzz": fuzz, "flood": flood, "persist": persist, "amplify": amplify, "soak": soak}
    report = commands[args.command](args)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
