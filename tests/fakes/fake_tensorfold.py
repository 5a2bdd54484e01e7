#!/usr/bin/env python3
"""A stand-in for ``tensorfold serve``: the engine protocol with canned replies, and the reference
recipe's patched engine behaviours (docs/engine-protocol.md, ../shared/reference/recipe.md §8, §9).

Standard library only, so it runs under any Python 3.11 (the fake ``docker`` execs it).
Rank 1 prints TensorFold's ready line and waits for SIGTERM; rank 0 prints the serving line and
serves HTTP on ``--host``/``--port`` until SIGTERM.

What it models of the recipe's engine (the flags and variables the recipe's ranks read):

- ``--parallel N`` lanes over one shared KV pool (``FAKE_TENSORFOLD_POOL_TOKENS``, default
  2,922,496, the recipe's measured pool): N requests run at once, the rest wait in FIFO order; a
  queued request whose client left is dropped at once (the recipe's callers poll every 0.1 s).
- ``TF_GLM_MAX_QUEUED=M``: all lanes busy and M requests queued → ``429`` with ``Retry-After: 5``
  at once, before a stream opens (unset: queue; ``0``: refuse anything past the lanes).
- Kept prompt states: a request's prompt is kept after it ends (``TF_GLM_CACHE_ENTRIES``, default
  32, least recently used first out); a prompt that starts with a kept one resumes from it: its
  ``usage.prompt_tokens_details.cached_tokens`` and ``cached_tokens_total`` count the kept part.
- ``/health`` with the recipe's fields (``streams`` as ``decoding``/``filling``/``paused``,
  ``pool_tokens``, ``pool_free_tokens``, ``kept_prompts``, ``kept_bytes``, ``kept_bytes_cap``,
  ``kept_mix``, ``iteration_s``, draft totals); ``/metrics`` adds every number of ``/health`` as
  ``tensorfold_health:<name>`` (patch 0045).
- Peer watch (patch 0115, ``TENSORFOLD_PEER_TIMEOUT_S``, with ``FAKE_TENSORFOLD_RENDEZVOUS``): rank 1
  beats every timeout/8 s; rank 0 exits 1 when rank 1 is silent that long or joins again; rank 1
  exits 1 when rank 0's store goes away, unless rank 0 marked a clean stop (then it runs on until
  it is stopped itself, exit 0).

Knobs of the stand-in itself, from the environment (the launcher's ``-e`` arguments reach it):

``FAKE_TENSORFOLD_BROKEN=done|n|usage``  break one clause (no ``[DONE]``, accept ``n=2``, bad usage sum)
``FAKE_TENSORFOLD_FAIL=message``         refuse to start like TensorFold: ``tensorfold: message``, exit 1
``FAKE_TENSORFOLD_LOAD_S=seconds``       pretend loading takes this long before ready
``FAKE_TENSORFOLD_IGNORE_TERM=1``        once ready, ignore SIGTERM (a hung rank: only SIGKILL ends it)
``FAKE_TENSORFOLD_RENDEZVOUS=1``         with ``--tp 2``: rank 0 listens on ``--master:--master-port`` and
                                         serves only once rank 1 has joined; rank 1 exits 1 when rank 0's
                                         connection closes (as its doorbell wait fails when rank 0 dies)
``FAKE_TENSORFOLD_HOLD=1``               each reply waits after its first event until ``POST /fake/release``
                                         (so a test holds N lanes busy without timing anything); without
                                         it, only requests whose body says ``FAKE-HOLD`` wait
``FAKE_TENSORFOLD_POOL_TOKENS=N``        the shared pool's size in tokens

``POST /fake/wedge`` hangs the engine the way a GLM pair can hang silently: ``/health`` still says
``"ok": true``, but no generating request is answered until ``POST /fake/unwedge`` (or its client
leaves). The supervisor's progress checks must notice (``sparkfold.node.liveness``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

REPLY = ["Hello", " from", " the", " fake", " engine", "."]
BROKEN = os.environ.get("FAKE_TENSORFOLD_BROKEN", "")
HOLD = bool(os.environ.get("FAKE_TENSORFOLD_HOLD"))
HOLD_MARK = "FAKE-HOLD"  # a request that says this waits as with HOLD (a running pair's test)
RETRY_AFTER_S = 5
KEPT_BYTES_PER_TOKEN = 6_700  # the recipe's spill files: ~6.7 KB per token per Spark
POLL_S = 0.1


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
    parser.add_argument("--parallel", default="1")
    parser.add_argument("--drafter", default="auto")
    args, _ = parser.parse_known_args(argv)
    args.parallel = 1 if args.parallel == "auto" else int(args.parallel)
    if not 1 <= args.parallel <= 8:
        parser.error("--parallel: 1 to 8")
    return args


def prompt_tokens(body: dict[str, Any]) -> list[str]:
    """The prompt as "tokens": one per character of the rendered request (kept-state keys)."""
    rendered = json.dumps(body.get("messages", body.get("prompt", "")), sort_keys=True)
    return list(rendered)


class Refused(Exception):
    """All lanes busy and the admission cap reached: 429 + Retry-After."""


class Engine:
    """N lanes over one pool, a FIFO queue, kept prompt states and the recipe's /health counters."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.name = args.name or os.path.basename(args.model.rstrip("/"))
        self.context = args.context
        self.max_tokens = args.max_tokens
        self.parallel = args.parallel
        self.drafts = args.drafter != "none"
        cap = os.environ.get("TF_GLM_MAX_QUEUED", "")
        self.max_queued = int(cap) if cap else None
        self.entries = int(os.environ.get("TF_GLM_CACHE_ENTRIES", "32"))
        self.kept_bytes_cap = int(float(os.environ.get("TF_GLM_KEPT_BYTES_GIB", "0")) * 2**30)
        self.pool_tokens = int(os.environ.get("FAKE_TENSORFOLD_POOL_TOKENS", "2922496"))
        self.lock = threading.Condition()
        self.running = 0
        self.queue: collections.deque[object] = collections.deque()
        self.kept: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.in_use = 0
        self.released = threading.Event()
        self.working = threading.Event()  # cleared by POST /fake/wedge
        self.working.set()
        self.requests = self.completion_tokens = self.prompt_tokens_total = 0
        self.cached_tokens_total = self.rounds = self.drafted = self.accepted = 0

    # --- admission: lanes, queue, the cap ---------------------------------------------------

    def admit(self, gone: Any) -> bool:
        """Take a lane (waiting in FIFO order); False if the client left while queued."""
        ticket = object()
        with self.lock:
            if self.running < self.parallel and not self.queue:
                self.running += 1
                return True
            if self.max_queued is not None and len(self.queue) >= self.max_queued:
                raise Refused(
                    f"all {self.parallel} lanes are busy and {len(self.queue)} requests are queued "
                    "(TF_GLM_MAX_QUEUED); retry later"
                )
            self.queue.append(ticket)
            while not (self.running < self.parallel and self.queue[0] is ticket):
                if gone():
                    self.queue.remove(ticket)
                    self.lock.notify_all()
                    return False
                self.lock.wait(POLL_S)
            self.queue.popleft()
            self.running += 1
            self.lock.notify_all()
            return True

    def leave(self, tokens: int) -> None:
        with self.lock:
            self.running -= 1
            self.in_use -= tokens
            self.lock.notify_all()

    # --- kept prompt states ------------------------------------------------------------------

    def resume(self, prompt: list[str]) -> int:
        """Tokens of ``prompt`` resumed from the longest kept state it starts with; takes pool rows."""
        text = "".join(prompt)
        with self.lock:
            cached = 0
            for key in list(self.kept):
                if text.startswith(key) and len(key) > cached:
                    cached = len(key)
                    self.kept.move_to_end(key)
            self.in_use += len(prompt)
            self.requests += 1
            self.prompt_tokens_total += len(prompt)
            self.cached_tokens_total += cached
            return cached

    def keep(self, prompt: list[str], completion: int) -> None:
        with self.lock:
            self.kept["".join(prompt)] = len(prompt)
            self.kept.move_to_end("".join(prompt))
            while len(self.kept) > self.entries or (
                self.kept_bytes_cap and self._kept_bytes() > self.kept_bytes_cap
            ):
                self.kept.popitem(last=False)
            self.completion_tokens += completion
            self.rounds += completion
            if self.drafts:
                self.drafted += completion
                self.accepted += completion // 2

    def _kept_bytes(self) -> int:
        return sum(self.kept.values()) * KEPT_BYTES_PER_TOKEN

    def usage(self, prompt: int, completion: int, cached: int) -> dict[str, Any]:
        total = prompt + completion + (1 if BROKEN == "usage" else 0)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": total,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def health(self) -> dict[str, Any]:
        with self.lock:
            kept_tokens = sum(self.kept.values())
            return {
                "ok": True,
                "backend": "tensorfold",
                "busy": self.running > 0,
                "requests_running": self.running,
                "requests_waiting": len(self.queue),
                "requests_total": self.requests,
                "prompt_tokens_total": self.prompt_tokens_total,
                "completion_tokens_total": self.completion_tokens,
                "prefill_seconds_total": 0.0,
                "decode_seconds_total": 0.0,
                "cached_tokens_total": self.cached_tokens_total,
                "rounds_total": self.rounds,
                "drafted_total": self.drafted,
                "accepted_total": self.accepted,
                "context_length": self.context,
                "streams": {"decoding": self.running, "filling": 0, "paused": 0},
                "pool_tokens": self.pool_tokens,
                "pool_free_tokens": self.pool_tokens - self.in_use - kept_tokens,
                "kept_prompts": len(self.kept),
                "kept_bytes": kept_tokens * KEPT_BYTES_PER_TOKEN,
                "kept_bytes_cap": self.kept_bytes_cap,
                "kept_mix": {"own": len(self.kept), "shared": 0},
                "iteration_s": 0.0,
            }

    def metrics(self) -> str:
        health = self.health()
        lines = [
            "# TYPE tensorfold:requests_total counter",
            f"tensorfold:requests_total {health['requests_total']}",
            "# TYPE tensorfold:requests_running gauge",
            f"tensorfold:requests_running {health['requests_running']}",
            "# TYPE tensorfold:requests_waiting gauge",
            f"tensorfold:requests_waiting {health['requests_waiting']}",
        ]
        for name, value in sorted(health.items()):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                lines.append(f"tensorfold_health:{name} {value}")
        return "\n".join(lines) + "\n"


def error(status: int, message: str, code: str | None = None) -> tuple[int, dict[str, Any]]:
    kind = "rate_limit_error" if status == 429 else "invalid_request_error"
    return status, {"error": {"message": message, "type": kind, "param": None, "code": code}}


class Handler(BaseHTTPRequestHandler):
    engine: Engine
    held = False  # this request waits for POST /fake/release (reply() decides)

    def log_message(self, format: str, *args: Any) -> None:  # one line per request, like 0.6.2+
        print(f"[tensorfold] {self.command} {self.path} {args[1] if len(args) > 1 else ''}", flush=True)

    def send_json(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def client_gone(self) -> bool:
        """The client closed its connection (readable with nothing to read)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def do_GET(self) -> None:
        if self.path in ("/health", "/v1/health"):
            self.send_json(200, self.engine.health())
        elif self.path in ("/v1/models", "/models"):
            model = {"id": self.engine.name, "object": "model", "owned_by": "tensorfold"}
            self.send_json(200, {"object": "list", "data": [model]})
        elif self.path in ("/metrics", "/v1/metrics"):
            text = self.engine.metrics().encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.send_header("content-length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
        else:
            self.send_json(*error(404, f"no route {self.path}"))

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.path == "/fake/release":
            self.engine.released.set()
            self.send_json(200, {"released": True})
            return
        if self.path in ("/fake/wedge", "/fake/unwedge"):
            (self.engine.working.clear if self.path == "/fake/wedge" else self.engine.working.set)()
            self.send_json(200, {"wedged": not self.engine.working.is_set()})
            return
        if self.path in ("/tokenize", "/v1/tokenize"):  # 0.6.3+: vLLM's fields, counted as the chat counts
            try:
                count = len(prompt_tokens(json.loads(raw)))
            except (ValueError, AttributeError):
                self.send_json(*error(400, "body is not a JSON object"))
                return
            self.send_json(
                200, {"count": count, "max_model_len": self.engine.context, "tokens": list(range(count))}
            )
            return
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
        while not self.engine.working.wait(POLL_S):  # wedged: no answer, /health still ok
            if self.client_gone():
                return
        try:
            admitted = self.engine.admit(self.client_gone)
        except Refused as exc:
            self.send_json(*error(429, str(exc)), headers={"retry-after": str(RETRY_AFTER_S)})
            return
        if not admitted:
            print("[tensorfold] a queued request's client left: dropped", flush=True)
            return
        prompt = prompt_tokens(body)
        pieces = REPLY[: body.get("max_tokens") or self.engine.max_tokens]
        try:
            cached = self.engine.resume(prompt)
            self.reply(body, pieces, self.engine.usage(len(prompt), len(pieces), cached))
            self.engine.keep(prompt, len(pieces))
        finally:
            self.engine.leave(len(prompt))

    def hold(self) -> None:
        """With FAKE_TENSORFOLD_HOLD or HOLD_MARK: wait for ``POST /fake/release`` (or the client to go)."""
        while self.held and not self.engine.released.wait(POLL_S):
            if self.client_gone():
                return

    def reply(self, body: dict[str, Any], pieces: list[str], usage: dict[str, Any]) -> None:
        self.held = HOLD or HOLD_MARK in json.dumps(body)
        finish = "length" if len(pieces) < len(REPLY) else "stop"
        stats = {"prefill_s": 0.0, "decode_s": 0.0, "cached": usage["prompt_tokens_details"]["cached_tokens"]}
        if body.get("stream") and self.path == "/v1/chat/completions":
            self.stream(pieces, usage, stats, bool((body.get("stream_options") or {}).get("include_usage")))
            return
        self.hold()
        if self.path == "/v1/completions":
            choice = {"index": 0, "text": "".join(pieces), "finish_reason": "length"}
            reply = {"object": "text_completion", "model": self.engine.name, "choices": [choice]}
            self.send_json(200, reply | {"usage": usage, "tensorfold": stats})
            return
        message = {"role": "assistant", "content": "".join(pieces), "reasoning_content": None}
        self.send_json(
            200,
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.engine.name,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage,
                "tensorfold": stats,
            },
        )

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
        if len(prompt_tokens(body)) + budget > self.engine.context:
            message = f"This server's maximum context length is {self.engine.context} tokens"
            return error(400, message, "context_length_exceeded")
        return None

    def stream(
        self, pieces: list[str], usage: dict[str, Any], stats: dict[str, Any], include_usage: bool
    ) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
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
                chunk |= {"usage": usage, "tensorfold": stats}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            if i == 0:
                self.hold()
        if include_usage:
            chunk = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "model": self.engine.name,
                "choices": [],
                "usage": usage,
            }
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if BROKEN != "done":
            self.wfile.write(b"data: [DONE]\n\n")


# --- two ranks: rendezvous and the peer watch ---------------------------------------------------

RENDEZVOUS_TIMEOUT_S = 600.0
LOST_PEER = 1
BEAT, STOP = b".", b"!"
lost = threading.Event()
peers: list[socket.socket] = []


def peer_timeout_s() -> float | None:
    """``TENSORFOLD_PEER_TIMEOUT_S`` (the recipe's peer watch); None when unset or 0 (never)."""
    value = float(os.environ.get("TENSORFOLD_PEER_TIMEOUT_S", "0") or 0)
    return value or None


def die(message: str, stop: threading.Event) -> None:
    if not stop.is_set():
        print(f"tensorfold: {message}", file=sys.stderr, flush=True)
        lost.set()
        stop.set()


def wait_for_rank1(args: argparse.Namespace, stop: threading.Event) -> socket.socket | None:
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
        return listener
    listener.close()
    return None


def watch_rank1(listener: socket.socket, timeout_s: float, stop: threading.Event) -> None:
    """Rank 0 ends when rank 1 is silent for ``timeout_s`` or joins again (patch 0115)."""
    peer = peers[0]
    peer.settimeout(POLL_S)
    last = time.monotonic()
    while not stop.is_set():
        try:
            again, _ = listener.accept()
        except (TimeoutError, OSError):
            again = None
        if again is not None:
            again.close()
            die("rank 1 started again: a rank that stops cannot rejoin; restart every rank", stop)
            return
        with contextlib.suppress(OSError):  # TimeoutError included: nothing this time
            if peer.recv(64):
                last = time.monotonic()
        if time.monotonic() - last > timeout_s:
            die(f"rank 1 showed no sign of life for {timeout_s:g} s (TENSORFOLD_PEER_TIMEOUT_S)", stop)
            return


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


def beat(peer: socket.socket, every_s: float, stop: threading.Event) -> None:
    while not stop.wait(every_s):
        try:
            peer.sendall(BEAT)
        except OSError:
            return


def watch_rank0(peer: socket.socket, stop: threading.Event) -> None:
    """Rank 1 exits 1 when rank 0's connection closes; with the peer watch, not after a clean stop.

    The recipe's workers keep running after rank 0 marked a clean stop (``tf_stop``), so a spill
    flush finishes; they end when they are stopped themselves.
    """
    peer.settimeout(None)
    clean = False
    try:
        while data := peer.recv(1024):
            clean = clean or STOP in data
    except OSError:
        pass
    if clean:
        print("[tensorfold] rank 0 stopped cleanly; waiting to be stopped", flush=True)
    else:
        die("lost rank 0 (rendezvous store connection closed)", stop)


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
    timeout_s = peer_timeout_s()
    if args.rank > 0:
        peer = join_rank0(args, stop) if rendezvous else None
        if rendezvous and peer is None:
            return 0 if stop.is_set() else 1
        print(f"[tensorfold] rank {args.rank} ready in {loaded:.1f} s, following rank 0", flush=True)
        if peer is not None:
            threading.Thread(target=watch_rank0, args=(peer, stop), daemon=True).start()
            if timeout_s is not None:
                every = min(2.0, timeout_s / 8)
                threading.Thread(target=beat, args=(peer, every, stop), daemon=True).start()
        stop.wait()
        return LOST_PEER if lost.is_set() else 0
    listener = wait_for_rank1(args, stop) if rendezvous else None
    if rendezvous and listener is None:
        return 0
    if listener is not None and timeout_s is not None:
        threading.Thread(target=watch_rank1, args=(listener, timeout_s, stop), daemon=True).start()
    engine = Engine(args)
    print(
        f"[tensorfold] serving {engine.name} at http://{args.host}:{args.port}/v1 on CUDA, "
        f"rank 0 of {args.tp} "
        f"(sampling: fake; drafts: {'on' if engine.drafts else 'off'}; prompts: bf16; "
        f"context: {args.context}; parallel: {args.parallel}; loaded in {loaded:.1f} s)",
        flush=True,
    )
    Handler.engine = engine
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stop.wait()
    if timeout_s is not None and not lost.is_set():
        for peer in peers:  # a clean stop: the workers end without counting it as a lost peer
            with contextlib.suppress(OSError):
                peer.sendall(STOP)
    server.shutdown()
    server.server_close()
    print("[tensorfold] server closed", flush=True)
    return LOST_PEER if lost.is_set() else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
