#!/usr/bin/env python3
"""A stand-in for ``tensorfold serve`` that keeps docs/engine-protocol.md with canned replies.

Standard library only, so it runs under any Python 3.11 (the fake ``docker`` execs it).
Rank 1 prints TensorFold's ready line and waits for SIGTERM; rank 0 prints the serving line and
serves HTTP on ``--host``/``--port`` until SIGTERM. Knobs, from the environment (the launcher's
``-e`` arguments reach it):

``FAKE_TENSORFOLD_BROKEN=done|n|usage``  break one clause (no ``[DONE]``, accept ``n=2``, bad usage sum)
``FAKE_TENSORFOLD_FAIL=message``         refuse to start like TensorFold: ``tensorfold: message``, exit 1
``FAKE_TENSORFOLD_LOAD_S=seconds``       pretend loading takes this long before ready
``FAKE_TENSORFOLD_IGNORE_TERM=1``        once ready, ignore SIGTERM (a hung rank: only SIGKILL ends it)
``FAKE_TENSORFOLD_RENDEZVOUS=1``         with ``--tp 2``: rank 0 listens on ``--master:--master-port`` and
                                         serves only once rank 1 has joined; rank 1 exits 1 when rank 0's
                                         connection closes (as its doorbell wait fails when rank 0 dies)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

REPLY = ["Hello", " from", " the", " fake", " engine", "."]
PROMPT_TOKENS = 5
BROKEN = os.environ.get("FAKE_TENSORFOLD_BROKEN", "")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tensorfold")
    parser.add_argument("subcommand", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--master", default="")
    parser.add_argument("--master-port", type=int, default=29551)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--name", default="")
    parser.add_argument("--context", type=int, default=2051)
    parser.add_argument("--max-tokens", type=int, default=4096)
    args, _ = parser.parse_known_args(argv)
    return args


class Engine:
    def __init__(self, args: argparse.Namespace) -> None:
        self.name = args.name or os.path.basename(args.model.rstrip("/"))
        self.context = args.context
        self.max_tokens = args.max_tokens
        self.lock = threading.Lock()
        self.requests = self.completion_tokens = 0

    def usage(self, completion: int) -> dict[str, int]:
        total = PROMPT_TOKENS + completion + (1 if BROKEN == "usage" else 0)
        return {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": completion, "total_tokens": total}

    def count(self, completion: int) -> None:
        with self.lock:
            self.requests += 1
            self.completion_tokens += completion

    def health(self) -> dict[str, Any]:
        return {
            "ok": True,
            "backend": "tensorfold",
            "busy": False,
            "requests_running": 0,
            "requests_total": self.requests,
            "prompt_tokens_total": PROMPT_TOKENS * self.requests,
            "completion_tokens_total": self.completion_tokens,
            "context_length": self.context,
            "streams": 1,
        }


def error(status: int, message: str, code: str | None = None) -> tuple[int, dict[str, Any]]:
    return status, {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    }


class Handler(BaseHTTPRequestHandler):
    engine: Engine

    def log_message(self, format: str, *args: Any) -> None:  # one line per request, like 0.6.2+
        print(f"[tensorfold] {self.command} {self.path} {args[1] if len(args) > 1 else ''}", flush=True)

    def send_json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self.send_json(200, self.engine.health())
        elif self.path == "/v1/models":
            model = {"id": self.engine.name, "object": "model", "owned_by": "tensorfold"}
            self.send_json(200, {"object": "list", "data": [model]})
        elif self.path == "/metrics":
            text = (
                "# TYPE tensorfold:requests_total counter\n"
                f"tensorfold:requests_total {self.engine.requests}\n"
            ).encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.send_header("content-length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
        else:
            self.send_json(*error(404, f"no route {self.path}"))

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            self.send_json(*error(404, f"no route {self.path}"))
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self.send_json(*error(400, "body is not valid JSON"))
            return
        refusal = self.refusal(body)
        if refusal is not None:
            self.send_json(*refusal)
            return
        pieces = REPLY[: body.get("max_tokens") or self.engine.max_tokens]
        self.engine.count(len(pieces))
        if self.path == "/v1/completions":
            choice = {"index": 0, "text": "".join(pieces), "finish_reason": "length"}
            reply = {"object": "text_completion", "model": self.engine.name, "choices": [choice]}
            self.send_json(200, reply | {"usage": self.engine.usage(len(pieces))})
        elif body.get("stream"):
            self.stream(pieces, bool((body.get("stream_options") or {}).get("include_usage")))
        else:
            message = {"role": "assistant", "content": "".join(pieces), "reasoning_content": None}
            finish = "length" if len(pieces) < len(REPLY) else "stop"
            reply = {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.engine.name,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": self.engine.usage(len(pieces)),
                "tensorfold": {"prefill_s": 0.0, "decode_s": 0.0, "cached": 0},
            }
            self.send_json(200, reply)

    def refusal(self, body: Any) -> tuple[int, dict[str, Any]] | None:
        if not isinstance(body, dict):
            return error(400, "the body must be a JSON object")
        if self.path == "/v1/chat/completions" and not isinstance(body.get("messages"), list):
            return error(400, "messages: must be a list of messages")
        if body.get("n", 1) != 1 and BROKEN != "n":
            return error(400, "n: only n = 1 is supported")
        budget = body.get("max_tokens", self.engine.max_tokens)
        if not isinstance(budget, int) or budget < 1:
            return error(400, "max_tokens: must be a positive integer")
        if PROMPT_TOKENS + budget > self.engine.context:
            message = f"This server's maximum context length is {self.engine.context} tokens"
            return error(400, message, "context_length_exceeded")
        return None

    def stream(self, pieces: list[str], include_usage: bool) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        deltas: list[dict[str, Any]] = [{"role": "assistant"}] + [{"content": p} for p in pieces]
        for i, delta in enumerate(deltas):
            last = i == len(deltas) - 1
            finish = ("length" if len(pieces) < len(REPLY) else "stop") if last else None
            chunk: dict[str, Any] = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "model": self.engine.name,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            if last and not include_usage:
                chunk |= {"usage": self.engine.usage(len(pieces)), "tensorfold": {"decode_s": 0.0}}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if include_usage:
            chunk = {
                "object": "chat.completion.chunk",
                "choices": [],
                "usage": self.engine.usage(len(pieces)),
            }
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if BROKEN != "done":
            self.wfile.write(b"data: [DONE]\n\n")


RENDEZVOUS_TIMEOUT_S = 600.0
LOST_RANK0 = 1
lost = threading.Event()
peers: list[socket.socket] = []


def wait_for_rank1(args: argparse.Namespace, stop: threading.Event) -> bool:
    """Rank 0's side of the rendezvous: listen on --master:--master-port until rank 1 joins."""
    listener = socket.create_server((args.master, args.master_port), reuse_port=False)
    listener.settimeout(0.2)
    started = time.monotonic()
    print("[tensorfold] rank 0 finished loading; waiting for rank 1 (0 s)", flush=True)
    while not stop.is_set() and time.monotonic() - started < RENDEZVOUS_TIMEOUT_S:
        try:
            peer, _ = listener.accept()
        except TimeoutError:
            continue
        peers.append(peer)  # kept open: rank 1 watches it
        return True
    return False


def join_rank0(args: argparse.Namespace, stop: threading.Event) -> socket.socket | None:
    """Rank 1's side: connect to rank 0's rendezvous port, retrying until it listens."""
    print(f"[tensorfold] rank {args.rank} finished loading; waiting for rank 0 (0 s)", flush=True)
    started = time.monotonic()
    while not stop.is_set() and time.monotonic() - started < RENDEZVOUS_TIMEOUT_S:
        try:
            return socket.create_connection((args.master, args.master_port), timeout=1)
        except OSError:
            stop.wait(0.1)
    if not stop.is_set():
        print("tensorfold: rank 0 did not answer at the rendezvous", file=sys.stderr, flush=True)
    return None


def watch_rank0(peer: socket.socket, stop: threading.Event) -> None:
    """Rank 1 exits when rank 0's connection closes (its doorbell wait fails)."""
    peer.settimeout(None)
    try:
        while peer.recv(1024):
            pass
    except OSError:
        pass
    if not stop.is_set():
        print("tensorfold: lost rank 0 (rendezvous store connection closed)", file=sys.stderr, flush=True)
        lost.set()
        stop.set()


def main(argv: list[str]) -> int:
    args = parse(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if os.environ.get("FAKE_TENSORFOLD_FAIL"):
        print(f"tensorfold: {os.environ['FAKE_TENSORFOLD_FAIL']}", file=sys.stderr, flush=True)
        return 1
    started = time.monotonic()
    print(
        "[tensorfold] building CUDA extension fake_kernels (first start after an install or update)",
        flush=True,
    )
    if stop.wait(float(os.environ.get("FAKE_TENSORFOLD_LOAD_S", "0"))):
        return 0
    loaded = time.monotonic() - started
    if os.environ.get("FAKE_TENSORFOLD_IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rendezvous = bool(os.environ.get("FAKE_TENSORFOLD_RENDEZVOUS")) and args.tp > 1
    if args.rank > 0:
        peer = join_rank0(args, stop) if rendezvous else None
        if rendezvous and peer is None:
            return 0 if stop.is_set() else 1
        print(f"[tensorfold] rank {args.rank} ready in {loaded:.1f} s, following rank 0", flush=True)
        if peer is not None:
            threading.Thread(target=watch_rank0, args=(peer, stop), daemon=True).start()
        stop.wait()
        return LOST_RANK0 if lost.is_set() else 0
    if rendezvous and not wait_for_rank1(args, stop):
        return 0
    engine = Engine(args)
    print(
        f"[tensorfold] serving {engine.name} at http://{args.host}:{args.port}/v1 on CUDA, "
        f"rank 0 of {args.tp} "
        f"(sampling: fake; drafts: off; prompts: bf16; context: {args.context}; loaded in {loaded:.1f} s)",
        flush=True,
    )
    Handler.engine = engine
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stop.wait()
    server.shutdown()
    server.server_close()
    print("[tensorfold] server closed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
