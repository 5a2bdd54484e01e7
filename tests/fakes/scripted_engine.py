"""A scripted engine server: speaks the engine protocol and replays token streams.

Tests tell it what to answer with :class:`Script` (reasoning and content tokens, tool calls, pace,
an error or a stall after N tokens, a refusal status) and read what happened from its counters
(requests seen, streams cancelled by the client, streams completed). :class:`ServerThread` runs
any ASGI app under uvicorn on a free loopback port in a background thread.

    engine = ScriptedEngine()
    with ServerThread(engine) as server:
        engine.queue(Script(content=["Hi", "!"], pace_s=0.01))
        ... requests to server.url ...
        engine.wait_for(lambda: engine.completed == 1)
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn

__all__ = ["Script", "ScriptedEngine", "ServerThread", "free_port"]

Scope = dict[str, Any]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Script:
    content: list[str] = field(default_factory=lambda: ["Hello", ",", " world", "!"])
    reasoning: list[str] = field(default_factory=list)
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments JSON text)
    finish_reason: str | None = None  # default: tool_calls if any, else stop
    stop_reason: str | None = None  # the matched stop string, as vLLM reports it
    pace_s: float = 0.0  # between tokens
    error_after: int | None = None  # send an error event after this many tokens
    stall_after: int | None = None  # after this many tokens, send nothing more (until cancelled)
    gate: threading.Event | None = None  # before the first token, wait until it is set (30 s at most)
    drop_after: int | None = None  # after this many tokens, close the stream without [DONE]
    status: int = 200  # != 200: refuse with this status before streaming
    code: str | None = None  # the refusal's error code ("capacity": the engine has no free lane)
    prompt_tokens: int = 7
    cached_tokens: int = 0  # of prompt_tokens, read from the engine's prefix cache
    heartbeat_s: float = 0.0  # while stalled, send ": keepalive" comments this often
    tool_pieces: int = 2  # each tool call's arguments arrive in this many deltas
    stall_before_finish: bool = False  # after the tool calls, send nothing more (until cancelled)

    def tokens(self) -> list[tuple[str, str]]:
        return [("reasoning_content", t) for t in self.reasoning] + [("content", t) for t in self.content]

    def finish(self) -> str:
        return self.finish_reason or ("tool_calls" if self.tool_calls else "stop")


def _chunk(delta: dict[str, Any], *, finish: str | None = None, **extra: Any) -> bytes:
    choice: dict[str, Any] = {"index": 0, "delta": delta}
    if finish is not None:
        choice["finish_reason"] = finish
    body = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "fake",
        "choices": [choice],
        **extra,
    }
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


class ScriptedEngine:
    """An ASGI app; thread-safe counters for tests."""

    def __init__(
        self,
        default: Script | None = None,
        *,
        peer: dict[str, Any] | None = None,
        responder: Callable[[dict[str, Any]], Script] | None = None,
    ) -> None:
        self.default = default or Script()
        self.responder = responder
        """With the queue empty, a request's script is ``responder(request body)`` (else ``default``)."""
        self.peer = peer
        self.healthy = True
        self.health_calls = 0
        self.models_calls = 0
        self.capabilities: dict[str, Any] | None = None  # the /v1/models card's block; None: none
        self.window: int | None = None  # the /v1/models card's max_model_len; None: not listed
        self.streams = 64  # lanes it reports in /health
        self.requests: list[dict[str, Any]] = []
        self.active = 0
        self.cancelled = 0
        self.completed = 0
        self.tokenizing = 0  # /tokenize calls being answered now, and the most at once
        self.most_tokenizing = 0
        self.tokenize_open = threading.Event()  # clear it to hold /tokenize answers until it is set
        self.tokenize_open.set()
        self._scripts: list[Script] = []
        self._cond = threading.Condition()

    # --- for tests ------------------------------------------------------------------------
    def queue(self, *scripts: Script) -> None:
        with self._cond:
            self._scripts.extend(scripts)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Block until ``predicate()`` holds (AssertionError after ``timeout``)."""
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                raise AssertionError(
                    f"condition not reached in {timeout}s: active={self.active} "
                    f"cancelled={self.cancelled} completed={self.completed}"
                )

    def _bump(self, name: str, by: int = 1) -> None:
        with self._cond:
            setattr(self, name, getattr(self, name) + by)
            self._cond.notify_all()

    def _next(self, request: dict[str, Any]) -> Script:
        with self._cond:
            if self._scripts:
                return self._scripts.pop(0)
        return self.responder(request) if self.responder is not None else self.default

    # --- ASGI -----------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        try:
            await self._handle(scope, receive, send)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:  # a request it cannot read
            await _json(
                send, {"error": {"message": f"scripted engine: {exc}", "type": "invalid_request_error"}}, 400
            )

    async def _handle(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path, body = scope["path"], b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(body) if body else {}
        if scope["method"] == "POST":
            with self._cond:
                self.requests.append({"path": path, **request})
                self._cond.notify_all()
        if path == "/health":
            self.health_calls += 1
            info = {
                "ok": self.healthy,
                "backend": "scripted",
                "requests_running": self.active,
                "streams": self.streams,
            }
            if self.peer is not None:
                info["peer"] = self.peer
            await _json(send, info)
        elif path == "/metrics":
            await _text(send, "# TYPE tensorfold:requests_running gauge\ntensorfold:requests_running 0\n")
        elif path == "/v1/models":
            self._bump("models_calls")
            card: dict[str, Any] = {"id": "fake", "object": "model", "owned_by": "test"}
            if self.capabilities is not None:
                card["capabilities"] = self.capabilities
            if self.window is not None:
                card["max_model_len"] = self.window
            await _json(send, {"object": "list", "data": [card]})
        elif path == "/tokenize":
            await self._tokenize_gate()
            text = request.get("prompt") or json.dumps(request.get("messages"))
            ids = list(range(len(text.split())))
            await _json(send, {"count": len(ids), "max_model_len": 8192, "tokens": ids})
        elif path == "/detokenize":
            await _json(send, {"prompt": " ".join(str(t) for t in request.get("tokens", []))})
        elif path in ("/v1/chat/completions", "/v1/completions"):
            script = self._next(request)
            if script.status != 200:
                error = {
                    "error": {
                        "message": f"scripted refusal {script.status}",
                        "type": "invalid_request_error",
                        "param": "messages",
                        "code": script.code,
                    }
                }
                await _json(send, error, status=script.status)
            elif request.get("stream"):
                await self._stream(script, receive, send)
            elif script.stall_after is not None:  # a non-streamed reply that never comes
                await self._hold(receive)
            else:
                await self._complete(script, send, chat=path == "/v1/chat/completions")
        else:
            await _json(send, {"error": {"message": "not found", "type": "not_found"}}, status=404)

    async def _tokenize_gate(self) -> None:
        """Count the call; wait (at most 30 s, off the loop) while ``tokenize_open`` is clear."""
        with self._cond:
            self.tokenizing += 1
            self.most_tokenizing = max(self.most_tokenizing, self.tokenizing)
            self._cond.notify_all()
        try:
            if not self.tokenize_open.is_set():
                await asyncio.get_running_loop().run_in_executor(None, self.tokenize_open.wait, 30)
        finally:
            self._bump("tokenizing", -1)

    async def _hold(self, receive: Any) -> None:
        """Answer nothing until the client leaves (counted as active, then cancelled)."""
        self._bump("active")
        try:
            await _disconnected(receive)
            self._bump("cancelled")
        finally:
            self._bump("active", -1)

    async def _complete(self, script: Script, send: Any, *, chat: bool) -> None:
        """The whole reply: a ``chat.completion`` or, for ``/v1/completions``, a ``text_completion``."""
        tokens = script.tokens()
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(t for k, t in tokens if k == "content"),
        }
        if script.reasoning:
            message["reasoning_content"] = "".join(script.reasoning)
        if script.tool_calls:
            message["tool_calls"] = [
                {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
                for i, (n, a) in enumerate(script.tool_calls)
            ]
        said: dict[str, Any] = {"message": message} if chat else {"text": message["content"]}
        choice: dict[str, Any] = {"index": 0, **said, "finish_reason": script.finish()}
        if script.stop_reason:
            choice["stop_reason"] = script.stop_reason
        await _json(
            send,
            {
                "id": "chatcmpl-fake" if chat else "cmpl-fake",
                "object": "chat.completion" if chat else "text_completion",
                "created": 1,
                "model": "fake",
                "choices": [choice],
                "usage": _usage(script, len(tokens)),
            },
        )
        self._bump("completed")

    async def _stream(self, script: Script, receive: Any, send: Any) -> None:
        self._bump("active")
        ended = False

        async def tracked_send(message: dict[str, Any]) -> None:
            nonlocal ended
            await send(message)
            ended = ended or (message["type"] == "http.response.body" and not message.get("more_body"))

        try:
            producer = asyncio.create_task(self._produce(script, tracked_send))
            watcher = asyncio.create_task(_disconnected(receive))
            await asyncio.wait({producer, watcher}, return_when=asyncio.FIRST_COMPLETED)
            producer.cancel()
            watcher.cancel()
            await asyncio.gather(producer, watcher, return_exceptions=True)
            # uvicorn reports a disconnect as soon as the response is complete, so the watcher can win
            # the race against a producer that already sent its last byte: that stream completed.
            self._bump("completed" if ended else "cancelled")
        finally:
            self._bump("active", -1)

    async def _produce(self, script: Script, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )

        async def out(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        await out(_chunk({"role": "assistant"}))
        if script.gate is not None:
            await asyncio.to_thread(script.gate.wait, 30)
        deadline = time.perf_counter()
        for n, (kind, token) in enumerate(script.tokens()):
            if script.error_after == n:
                await out(b'data: {"error":{"message":"scripted failure","type":"server_error"}}\n\n')
                await out(b"data: [DONE]\n\n")
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            if script.stall_after == n:
                await _stall(script, out)
            if script.drop_after == n:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            if script.pace_s:
                deadline += script.pace_s
                await asyncio.sleep(max(0.0, deadline - time.perf_counter()))
            await out(_chunk({kind: token}))
        if script.stall_after == len(script.tokens()):
            await _stall(script, out)
        for i, (name, arguments) in enumerate(script.tool_calls):
            size = -(-len(arguments) // script.tool_pieces) or 1
            pieces = [arguments[at : at + size] for at in range(0, len(arguments), size)] or [""]
            first = {
                "index": i,
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": name, "arguments": pieces[0]},
            }
            await out(_chunk({"tool_calls": [first]}))
            for piece in pieces[1:]:
                await out(_chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
        if script.stall_before_finish:
            await _stall(script, out)
        extra: dict[str, Any] = {"usage": _usage(script, len(script.tokens()))}
        final = _chunk({}, finish=script.finish(), **extra)
        if script.stop_reason:
            final = final.replace(
                b'"finish_reason"',
                b'"stop_reason":' + json.dumps(script.stop_reason).encode() + b',"finish_reason"',
            )
        await out(final)
        await out(b"data: [DONE]\n\n")
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _usage(script: Script, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": script.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": script.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": script.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": len(script.reasoning)},
    }


async def _stall(script: Script, out: Callable[[bytes], Any]) -> None:
    """Send nothing more (but heartbeats, when asked for) until the stream is cancelled."""
    if not script.heartbeat_s:
        await asyncio.Event().wait()
    while True:
        await asyncio.sleep(script.heartbeat_s)
        await out(b": keepalive\n\n")


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _json(send: Any, data: Any, status: int = 200) -> None:
    body = json.dumps(data).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _text(send: Any, text: str) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": text.encode()})


class ServerThread:
    """Serve an ASGI app with uvicorn on 127.0.0.1:<free port> in a daemon thread."""

    def __init__(self, app: Any, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
