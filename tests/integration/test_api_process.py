"""`sparkfold api` as a process: starts, serves, reloads its keys on SIGHUP, stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.fakes.scripted_engine import free_port
from tests.integration.engine_procs import start_api

from sparkfold.api.keys import hash_key


@pytest.fixture
def gateway_process(tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    keys = tmp_path / "api-keys"
    keys.write_text("first-key\n")
    port = free_port()
    config = tmp_path / "sparkfold.toml"
    config.write_text(
        f'[engine]\nmodel = "x"\nport = {free_port()}\n'
        f'[api]\nhost = "127.0.0.1"\nport = {port}\napi_keys_file = "{keys}"\n'
    )
    process = start_api(config, port)
    url = f"http://127.0.0.1:{port}"
    yield url, keys, process
    if process.poll() is None:
        process.terminate()
        process.wait(timeout=15)


def status(url: str, key: str) -> int:
    return httpx.get(url + "/v1/models", headers={"authorization": f"Bearer {key}"}).status_code


def test_keys_reload_on_sighup_and_term_stops(
    gateway_process: tuple[str, Path, subprocess.Popen[bytes]],
) -> None:
    url, keys, process = gateway_process
    assert status(url, "first-key") == 503  # past auth; the engine is not running
    assert status(url, "second-key") == 401
    keys.write_text(hash_key("second-key") + "\n")
    process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while status(url, "second-key") == 401:
        assert time.monotonic() < deadline, "keys were not reloaded"
        time.sleep(0.05)
    assert status(url, "first-key") == 401
    process.terminate()
    # uvicorn re-raises SIGTERM after a graceful shutdown; systemd counts that as a clean stop
    assert process.wait(timeout=15) in (0, -signal.SIGTERM)
    logs = process.stderr.read().decode()  # type: ignore[union-attr]
    assert '"msg": "api keys reloaded"' in logs
    assert "first-key" not in logs and "second-key" not in logs


def test_service_manager_hears_ready_reloading_and_stopping(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "sparkfold.toml"
    config.write_text(
        f'[engine]\nmodel = "x"\nport = {free_port()}\n[api]\nhost = "127.0.0.1"\nport = {port}\n'
    )
    states = tmp_path / "states"
    script = (
        "import sys; from sparkfold.api.server import serve; from sparkfold.config import load\n"
        "def note(*s):\n    open(sys.argv[2], 'a').write(' '.join(s) + '\\n')\n"
        "serve(load(sys.argv[1]), notify=note)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(config), str(states)], env=env, stderr=subprocess.DEVNULL
    )
    try:

        def wait_for(text: str) -> None:
            deadline = time.monotonic() + 30
            while not (states.exists() and text in states.read_text()):
                assert process.poll() is None and time.monotonic() < deadline, f"never notified {text}"
                time.sleep(0.05)

        wait_for("READY=1 STATUS=serving on 127.0.0.1")
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 503  # up; no engine
        process.send_signal(signal.SIGHUP)
        wait_for("RELOADING=1 MONOTONIC_USEC=")
        process.terminate()
        process.wait(timeout=15)
        lines = states.read_text().splitlines()
        assert [line.split()[0] for line in lines] == ["READY=1", "RELOADING=1", "READY=1", "STOPPING=1"]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def test_the_command_tells_systemd_it_is_ready(tmp_path: Path) -> None:
    import socket

    config = tmp_path / "sparkfold.toml"
    config.write_text(
        f'[engine]\nmodel = "x"\nport = {free_port()}\n[api]\nhost = "127.0.0.1"\nport = {free_port()}\n'
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(tmp_path / "notify"))
        listener.settimeout(30)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(sys.path),
            "NOTIFY_SOCKET": str(tmp_path / "notify"),
        }
        process = subprocess.Popen(
            [sys.executable, "-c", "from sparkfold.cli import main; main()", "api", "--config", str(config)],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert listener.recv(4096).decode().startswith("READY=1")
            process.terminate()
            assert listener.recv(4096).decode() == "STOPPING=1"
        finally:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=15)
