"""A fleet on loopback: N real gateways (each over a scripted engine), SMG, and the fleet front.

Each pair is a ``sparkfold api`` process in front of a :class:`ScriptedEngine` in this process, so
a test reads what each pair served from the pair's own engine log (``engine.requests``) and its
gateway's ``/metrics``. The router is ``sparkfold router`` (the real ``smg`` binary) and the front
is ``sparkfold fleet``, both child processes reading one fleet.toml, as the systemd units do.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_procs import ChildProcess
from tests.fakes.scripted_engine import Script, ScriptedEngine, ServerThread, free_port

from sparkfold.api.keys import hash_key

CLIENT_KEY = "sk-client-fleet-test"
ROUTER_KEY = "sk-router-fleet-test"
CONTROL_KEY = "sk-control-fleet-test"
SPARKFOLD = [sys.executable, "-c", "from sparkfold.cli import main; main()"]


@dataclass
class Pair:
    name: str
    engine: ScriptedEngine
    thread: ServerThread
    port: int
    config: Path
    log: Path
    process: ChildProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def saw(self, marker: str) -> int:
        """Requests this pair's engine received whose body mentions ``marker``."""
        return sum(marker in str(request) for request in self.engine.requests)

    def requests_with_status(self, status: int) -> float:
        text = httpx.get(self.url + "/metrics", headers={"authorization": f"Bearer {ROUTER_KEY}"}).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith("sparkfold_requests_total{") and f'status="{status}"' in line:
                total += float(line.rsplit(" ", 1)[1])
        return total


@dataclass
class Fleet:
    root: Path
    pairs: list[Pair] = field(default_factory=list)
    router: ChildProcess | None = None
    front: ChildProcess | None = None
    front_port: int = 0
    router_port: int = 0
    metrics_port: int = 0
    fleet_toml: Path = Path()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.front_port}"

    def pair(self, name: str) -> Pair:
        return next(p for p in self.pairs if p.name == name)

    def served_by(self, marker: str) -> set[str]:
        return {p.name for p in self.pairs if p.saw(marker)}

    def health(self) -> dict[str, Any]:
        reply: dict[str, Any] = httpx.get(self.url + "/health", timeout=10).json()
        return reply

    def wait_until(self, what: str, predicate: Callable[[dict[str, Any]], bool], deadline_s: float) -> None:
        """Poll the fleet's /health until ``predicate`` holds (bounded)."""
        end = time.monotonic() + deadline_s
        last: dict[str, Any] = {}
        while time.monotonic() < end:
            for proc in (self.router, self.front):
                if proc is not None and proc.proc.poll() is not None:
                    pytest.fail(f"{proc.log.name} exited:\n{proc.output()[-3000:]}")
            try:
                last = self.health()
            except (httpx.HTTPError, ValueError):
                last = {}
            if last and predicate(last):
                return
            time.sleep(0.2)
        pytest.fail(f"fleet never reached: {what}; last /health: {last}")

    def in_rotation(self) -> set[str]:
        return {p["name"] for p in self.health()["pairs"] if p["in"]}

    def start_gateway(self, pair: Pair) -> None:
        pair.process = ChildProcess([*SPARKFOLD, "api", "--config", str(pair.config)], pair.log)
        end = time.monotonic() + 30
        while True:
            try:
                if httpx.get(pair.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if pair.process.proc.poll() is not None or time.monotonic() > end:
                pytest.fail(f"gateway {pair.name} did not start:\n{pair.process.output()[-2000:]}")
            time.sleep(0.05)

    def stop_gateway(self, pair: Pair) -> None:
        assert pair.process is not None
        pair.process.stop()
        pair.process = None

    def write_fleet(self, draining: set[str] = frozenset(), **router: Any) -> None:
        lines = [
            "[front]",
            'host = "127.0.0.1"',
            f"port = {self.front_port}",
            f'api_keys_file = "{self.root / "client-keys"}"',
            "require_keys = true",
            "[router]",
            f"port = {self.router_port}",
            f"metrics_port = {self.metrics_port}",
            f'key_file = "{self.root / "router-key"}"',
            f'control_key_file = "{self.root / "control-key"}"',
            f'workers_file = "{self.root / "workers.json"}"',
            *(f"{k} = {_toml(v)}" for k, v in {"health_interval_s": 1, **router}.items()),
        ]
        for pair in self.pairs:
            lines += ["[[pairs]]", f'name = "{pair.name}"', f'url = "{pair.url}"']
            lines += ["draining = true"] if pair.name in draining else []
        self.fleet_toml.write_text("\n".join(lines) + "\n")

    def start(self, names: list[str], gateway: dict[str, Any], router: dict[str, Any]) -> None:
        (self.root / "client-keys").write_text(hash_key(CLIENT_KEY) + "\n")
        (self.root / "router-key").write_text(ROUTER_KEY + "\n")
        (self.root / "control-key").write_text(CONTROL_KEY + "\n")
        for name in names:
            engine = ScriptedEngine(Script(content=[name, " says", " hi"]))
            thread = ServerThread(engine).__enter__()
            port = free_port()
            keys = self.root / f"{name}-keys"
            keys.write_text(hash_key(ROUTER_KEY) + "\n")  # a pair accepts the router's key alone
            config = self.root / f"{name}.toml"
            api = {"host": "127.0.0.1", "port": port, "api_keys_file": str(keys), "require_keys": True}
            config.write_text(
                f'[engine]\nmodel = "x"\nserved_name = "fake"\nport = {thread.port}\n[api]\n'
                + "".join(f"{k} = {_toml(v)}\n" for k, v in {**api, **gateway}.items())
            )
            pair = Pair(name, engine, thread, port, config, self.root / f"{name}.log")
            self.pairs.append(pair)
            self.start_gateway(pair)
        self.front_port, self.router_port, self.metrics_port = free_port(), free_port(), free_port()
        self.fleet_toml = self.root / "fleet.toml"
        self.write_fleet(**router)
        config = ["--config", str(self.fleet_toml)]
        self.router = ChildProcess([*SPARKFOLD, "router", *config], self.root / "router.log")
        self.front = ChildProcess([*SPARKFOLD, "fleet", *config], self.root / "front.log")
        self.wait_until("every pair in", lambda h: h["pairs_in"] == len(names), deadline_s=60)

    def reload(self) -> None:
        """What the units' ExecReload does: rewrite SMG's manifest, and SIGHUP the front."""
        subprocess.run(
            [*SPARKFOLD, "router", "--config", str(self.fleet_toml), "--write-manifest"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        assert self.front is not None
        self.front.signal(signal.SIGHUP)

    def close(self) -> None:
        for proc in (self.front, self.router, *(p.process for p in self.pairs)):
            if proc is not None:
                proc.stop()
        for pair in self.pairs:
            pair.thread.__exit__()


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)
