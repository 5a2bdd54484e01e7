"""Helpers for tests that run real engine processes: configs, process handles, polling."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
RUNTIME = REPO / "runtime"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_config(
    path: Path, model: Path, *, rank: int = 0, fabric: dict[str, Any] | None = None, **engine: Any
) -> Path:
    """A sparkfold.toml for one rank."""
    values: dict[str, Any] = {
        "kind": "transformers",
        "model": str(model),
        "served_name": "smol",
        "context": 2048,
        "max_tokens": 64,
        "parallel": 2,
        "drain_s": 20,
        **engine,
    }
    lines = ["[node]", f"rank = {rank}", "[engine]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    if fabric:
        lines += ["[fabric]"] + [f"{key} = {json.dumps(value)}" for key, value in fabric.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


class ChildProcess:
    """A child process running this checkout's runtime, its output in ``log``."""

    def __init__(
        self, command: Sequence[str], log: Path, env: Mapping[str, str | None] | None = None
    ) -> None:
        """``env`` adds to (a value of None: removes from) this process's environment."""
        base: dict[str, str | None] = {**os.environ, "PYTHONPATH": str(RUNTIME), "OMP_NUM_THREADS": "1"}
        base.pop("NOTIFY_SOCKET", None)
        merged = {name: value for name, value in {**base, **(env or {})}.items() if value is not None}
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(command, env=merged, stdout=self._out, stderr=subprocess.STDOUT)

    def output(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")

    def wait_exit(self, deadline_s: float) -> int | None:
        try:
            return self.proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            return None

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def stop(self) -> None:
        """SIGKILL the process and everything it started, as systemd's ``KillMode=control-group``
        would: a tensorfold rank runs in its own session (``setsid``) and outlives its supervisor."""
        if self.proc.poll() is None:
            try:
                tree = psutil.Process(self.proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                tree = []
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
            for child in tree:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
            psutil.wait_procs(tree, timeout=30)
        self._out.close()


class EngineProcess(ChildProcess):
    """``sparkfold engine --config FILE`` as a child process (optionally inside a netns)."""

    def __init__(
        self, config: Path, log: Path, prefix: Sequence[str] = (), env: Mapping[str, str | None] | None = None
    ) -> None:
        command = [*prefix, sys.executable, "-c", "from sparkfold.cli import main; main()"]
        super().__init__([*command, "engine", "--config", str(config)], log, env)


def wait_healthy(url: str, proc: ChildProcess, deadline_s: float = 240) -> None:
    """Poll ``/health`` until it says ok (bounded); fail with the process log otherwise."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.proc.poll() is not None:
            pytest.fail(f"engine exited with {proc.proc.returncode}:\n{proc.output()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).json().get("ok"):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    pytest.fail(f"engine not healthy after {deadline_s} s:\n{proc.output()[-3000:]}")


def start_api(config: Path, port: int, deadline_s: float = 30) -> subprocess.Popen[bytes]:
    """``sparkfold api --config FILE`` as a child process (stderr piped for the test to read),
    returned once its ``/health`` answers on ``port`` at all (bounded)."""
    process = subprocess.Popen(
        [sys.executable, "-c", "from sparkfold.cli import main; main()", "api", "--config", str(config)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            return process
        except httpx.TransportError:
            assert process.poll() is None, process.stderr.read().decode()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "gateway did not start"
            time.sleep(0.05)


@contextlib.contextmanager
def serving(config: Path, log: Path, port: int) -> Iterator[str]:
    """``sparkfold engine`` on ``config`` for the block: its URL once ``/health`` is ok; killed after."""
    proc = EngineProcess(config, log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        proc.stop()


@functools.cache
def _reference_model(model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def reference_tokens(model_dir: Path, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Plain ``model.generate`` greedy continuation (the tp=1 reference), in this process."""
    import torch

    model = _reference_model(model_dir)
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False)
    return [int(t) for t in out[0, len(prompt_ids) :]]


def alone_and_together(server: str, prompts: list[str]) -> tuple[list[str], list[str]]:
    """Greedy completions of ``prompts`` asked one after another, then all at once."""

    async def ask(http: httpx.AsyncClient, prompt: str) -> str:
        body = {"prompt": prompt, "max_tokens": 16, "temperature": 0}
        reply = await http.post(f"{server}/v1/completions", json=body)
        return str(reply.json()["choices"][0]["text"])

    async def main() -> tuple[list[str], list[str]]:
        async with httpx.AsyncClient(timeout=120) as http:
            alone = [await ask(http, p) for p in prompts]
            together = await asyncio.gather(*(ask(http, p) for p in prompts))
        return alone, list(together)

    return asyncio.run(main())
