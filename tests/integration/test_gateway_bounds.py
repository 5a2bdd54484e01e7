"""`sparkfold api` as a process, attacked the cheap ways: connection limits and a restart mid-stream.

The gateway runs as a real process (uvicorn, httptools, its own connection limits, set small
here) in front of the scripted engine; clients are raw sockets, so nothing in between is kinder
than an attacker. Every wait is bounded by a socket timeout or a deadline.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from tests.fakes.conn_flood import Flood, connect_from
from tests.fakes.scripted_engine import Script, ScriptedEngine, ServerThread, free_port
from tests.integration.engine_procs import start_api

WAIT_S = 20  # the longest any single read below may block


@pytest.fixture
def start_gateway(
    tmp_path: Path, engine: tuple[ScriptedEngine, ServerThread]
) -> Iterator[Callable[..., tuple[str, int, subprocess.Popen[bytes]]]]:
    processes: list[subprocess.Popen[bytes]] = []

    def start(**api: object) -> tuple[str, int, subprocess.Popen[bytes]]:
        port = free_port()
        settings = {"host": "127.0.0.1", "port": port, **api}
        lines = "\n".join(f"{key} = {json.dumps(value)}" for key, value in settings.items())
        config = tmp_path / f"sparkfold-{port}.toml"
        config.write_text(
            f'[engine]\nmodel = "x"\nserved_name = "fake"\nport = {engine[1].port}\n[api]\n{lines}\n'
        )
        processes.append(process := start_api(config, port))
        url = f"http://127.0.0.1:{port}"
        return url, port, process

    yield start
    for process in processes:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=15)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes (bounded by the socket timeout per read)."""
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    return out


def send_all(sock: socket.socket, data: bytes) -> bool:
    """``False`` when the server closed before it took everything."""
    try:
        sock.sendall(data)
    except (ConnectionResetError, BrokenPipeError):
        return False
    return True


def health_ok(port: int) -> bool:
    return httpx.get(f"http://127.0.0.1:{port}/health", timeout=WAIT_S).status_code == 200


def test_oversized_and_too_many_headers_are_refused_before_auth(start_gateway: Callable[..., tuple]) -> None:
    _, port, _ = start_gateway(max_header_kib=8, max_headers=20)
    with connect(port) as sock:
        sent = send_all(
            sock, b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (4 << 20) + b"\r\n\r\n"
        )
        answer = read_all(sock)
    assert not sent or answer.startswith(b"HTTP/1.1 431"), answer[:200]
    with connect(port) as sock:
        many = b"".join(b"x-h%d: v\r\n" % i for i in range(1000))
        send_all(sock, b"GET /v1/models HTTP/1.1\r\nhost: x\r\n" + many + b"\r\n")
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 431") and b"more than 20 header fields" in answer, answer[:200]
    with connect(port) as sock:  # within the limits: served as before
        send_all(sock, b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert read_all(sock).startswith(b"HTTP/1.1 200")


def test_slow_headers_and_silent_connections_are_closed(start_gateway: Callable[..., tuple]) -> None:
    _, port, _ = start_gateway(header_timeout_s=1, idle_timeout_s=1)
    with connect(port) as silent, connect(port) as slow:
        send_all(slow, b"GET /health HTTP/1.1\r\nhost: x\r\n")  # and never the blank line
        assert read_all(silent) == b""  # closed by the server, not by our timeout (that raises)
        assert read_all(slow) == b""
    with connect(port) as kept:  # a finished request's connection is closed once idle
        send_all(kept, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        assert read_all(kept).startswith(b"HTTP/1.1 200")


def one_response(sock: socket.socket) -> bytes:
    """One response on a kept-alive connection (``b""`` when the server closed it instead)."""
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return b""
            data += chunk
    except (ConnectionResetError, BrokenPipeError):
        return b""
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(v for k, _, v in (h.partition(b": ") for h in head.split(b"\r\n")) if k == b"content-length")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head


def held_requests(sources: list[str], port: int) -> tuple[list[socket.socket], list[bytes]]:
    """One connection from each of ``sources`` in turn, each kept open once answered."""
    socks: list[socket.socket] = []
    answers = []
    for source in sources:
        sock = connect_from(source, port)
        socks.append(sock)
        ok = send_all(sock, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        answers.append(one_response(sock) if ok else b"")
    return socks, answers


def test_connections_past_the_caps_get_503_and_the_rest_are_served(
    start_gateway: Callable[..., tuple],
) -> None:
    _, port, _ = start_gateway(
        max_connections=20, max_connections_per_client=12, header_timeout_s=60, idle_timeout_s=60
    )
    socks: list[socket.socket] = []
    try:  # 127.0.0.1 to its cap (12), then 127.0.0.2 to the total (20), then both refused
        socks, answers = held_requests(["127.0.0.1"] * 14 + ["127.0.0.2"] * 9 + ["127.0.0.3"], port)
    finally:
        for sock in socks:
            sock.close()
    statuses = [a[:12] for a in answers]
    assert (
        statuses
        == [b"HTTP/1.1 200"] * 12 + [b"HTTP/1.1 503"] * 2 + [b"HTTP/1.1 200"] * 8 + [b"HTTP/1.1 503"] * 2
    ), statuses
    assert all(b"retry-after: 5" in a for a in answers if a.startswith(b"HTTP/1.1 503"))
    assert health_ok(port)  # the caps are free again: served


def test_a_refused_connection_that_sends_nothing_is_closed(start_gateway: Callable[..., tuple]) -> None:
    _, port, _ = start_gateway(max_connections=1, header_timeout_s=60)
    with connect(port) as held, connect(port) as refused:
        assert read_all(refused) == b""  # closed by the gateway (ours would raise a timeout)
        send_all(held, b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert read_all(held).startswith(b"HTTP/1.1 200")


def legitimate(port: int, seconds: float, every_s: float, max_requests: int) -> list[int]:
    """Requests from 127.0.0.2, each on a fresh connection, for ``seconds``: their statuses (0: failed)."""
    statuses: list[int] = []
    deadline = time.monotonic() + seconds
    transport = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(transport=transport, timeout=WAIT_S, base_url=f"http://127.0.0.1:{port}") as http:
        while time.monotonic() < deadline and len(statuses) < max_requests:
            try:
                response = http.post(
                    "/v1/chat/completions",
                    json={"model": "fake", "messages": [{"role": "user", "content": "hi"}]},
                    headers={"connection": "close"},
                )
                statuses.append(response.status_code)
            except httpx.TransportError:
                statuses.append(0)
            time.sleep(every_s)
    return statuses


def flood_while_serving(start_gateway: Callable[..., tuple], seconds: float) -> None:
    """The persistent flood of one address (more sockets than ``api.max_connections``, the served
    ones closed by the header timeout and re-opened at once) while another address is served."""
    _, port, _ = start_gateway(max_connections=24, max_connections_per_client=12, header_timeout_s=2)
    try:
        connect_from("127.0.0.2", port).close()
    except OSError:
        pytest.skip("this host cannot bind 127.0.0.2")
    flood = Flood(port, sockets=40, max_opens=int(1000 * seconds))
    flood.start()
    try:
        time.sleep(0.5)  # the flood holds its share before the first legitimate request
        statuses = legitimate(port, seconds, every_s=0.25, max_requests=int(8 * seconds))
        assert flood.is_alive()  # it lasted as long as the legitimate requests
    finally:
        flood.stop.set()
        flood.join(timeout=WAIT_S)
    assert statuses and statuses == [200] * len(statuses), Counter(statuses)
    assert flood.answers[b"HTTP/1.1 503"] > 0, flood.answers  # the excess was refused with 503 ...
    assert set(flood.answers) <= {b"HTTP/1.1 503", b""}, flood.answers  # ... or closed (timeout)
    assert flood.retry_after_missing == 0


def test_one_address_flooding_connections_leaves_the_others_served(
    start_gateway: Callable[..., tuple],
) -> None:
    flood_while_serving(start_gateway, seconds=3)  # past one header timeout (2 s)


@pytest.mark.slow
def test_one_address_flooding_connections_for_30_s_leaves_the_others_served(
    start_gateway: Callable[..., tuple],
) -> None:
    flood_while_serving(start_gateway, seconds=30)


STREAMS = [
    (
        "/v1/chat/completions",
        {"model": "fake", "stream": True, "messages": [{"role": "user", "content": "x"}]},
    ),
    (
        "/v1/messages",
        {"model": "fake", "stream": True, "max_tokens": 9, "messages": [{"role": "user", "content": "x"}]},
    ),
    ("/v1/responses", {"model": "fake", "stream": True, "input": "x"}),
]


def test_a_restart_ends_every_open_stream_with_an_error_and_its_end(
    start_gateway: Callable[..., tuple], engine: tuple[ScriptedEngine, ServerThread]
) -> None:
    fake, _ = engine
    fake.default = Script(content=["one", "two"], stall_after=1)
    url, _, process = start_gateway(shutdown_grace_s=10)
    with httpx.Client(base_url=url, timeout=WAIT_S) as http:
        opened = [http.stream("POST", path, json=body) for path, body in STREAMS]
        responses = [o.__enter__() for o in opened]
        lines = [r.iter_lines() for r in responses]
        for it in lines:  # each stream has started (the engine stalls after its first token)
            assert any("one" in line for line in it)
        process.send_signal(signal.SIGTERM)
        rest = ["\n".join(it) for it in lines]
        for o in opened:
            o.__exit__(None, None, None)
    chat, anthropic, responses_api = rest
    assert '"error"' in chat and "restarting" in chat and chat.rstrip().endswith("data: [DONE]")
    assert "event: error" in anthropic and "restarting" in anthropic
    assert "event: response.failed" in responses_api and "restarting" in responses_api
    assert process.wait(timeout=WAIT_S) in (0, -signal.SIGTERM)
