"""The one engine server, reached over HTTP (``settings.engine_url``).

:class:`Engine` wraps one ``httpx.AsyncClient``. JSON calls return the decoded body or raise an
:mod:`~sparkfold.api.errors` error: the engine's own 4xx keeps its status and message (it is the
client's mistake), anything else becomes an :class:`~sparkfold.api.errors.UpstreamError`.
:meth:`Engine.open_stream` opens a streamed request and checks its status *before* the gateway
starts its own response, so a refusal is still a plain JSON error; the caller must
:meth:`EngineStream.aclose` it (closing the connection is how the engine learns the client left).

Connections are spread over several small pools, one ``httpx.AsyncClient`` each, and a request
goes to the pool with the fewest requests in flight: httpcore's pool looks at every one of its
connections on each request, so one pool of 64 busy connections makes each new request cost 64
socket checks; pools of :data:`CONNECTIONS_PER_POOL` keep that constant.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from sparkfold.api.errors import (
    ApiError,
    ClientError,
    InvalidRequest,
    Overloaded,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)

__all__ = ["Engine", "EngineStream"]

CONNECT_TIMEOUT_S = 5.0
CONNECTIONS_PER_POOL = 4


class _Pool:
    __slots__ = ("client", "in_flight")

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.in_flight = 0


class EngineStream:
    """An open streamed response from the engine."""

    def __init__(self, response: httpx.Response, pool: _Pool) -> None:
        self._response = response
        self._pool: _Pool | None = pool

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (no line splitting here: that is the SSE reader's job)."""
        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout("the engine stopped sending mid-stream") from exc
        except (httpx.HTTPError, httpx.StreamError) as exc:
            raise UpstreamError(f"the engine's stream broke off: {type(exc).__name__}") from exc

    async def aclose(self) -> None:
        if self._pool is not None:
            self._pool.in_flight -= 1
            self._pool = None
        await self._response.aclose()


class Engine:
    """Client of the engine server at ``base_url``; ``transport`` swaps the network out in tests."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float,
        transport: httpx.AsyncBaseTransport | None = None,
        concurrency: int = CONNECTIONS_PER_POOL,
    ) -> None:
        self.base_url = base_url
        self._timeout = httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S).as_dict()
        self._urls: dict[str, httpx.URL] = {}
        tls = httpx.create_ssl_context()  # one for all pools: building one reads the CA bundle (slow)
        self._pools = [
            _Pool(
                httpx.AsyncClient(
                    base_url=base_url,
                    timeout=httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S),
                    limits=httpx.Limits(max_connections=None, max_keepalive_connections=CONNECTIONS_PER_POOL),
                    transport=transport,
                    verify=tls,
                    headers={"accept-encoding": "identity"},  # the stream is read raw, never compressed
                )
            )
            for _ in range(max(1, -(-concurrency // CONNECTIONS_PER_POOL)))
        ]

    def __repr__(self) -> str:
        return f"Engine({self.base_url!r})"

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.client.aclose()

    def _url(self, path: str) -> httpx.URL:
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = httpx.URL(self.base_url).join(path)
        return url

    def _pool(self) -> _Pool:
        return min(self._pools, key=lambda pool: pool.in_flight)

    async def get_json(self, path: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        response = await self._send("GET", path, None, timeout_s=timeout_s)
        return _decode(response)

    async def get_text(self, path: str, *, timeout_s: float | None = None) -> str:
        response = await self._send("GET", path, None, timeout_s=timeout_s)
        if response.status_code != 200:
            raise UpstreamError(f"the engine answered {path} with HTTP {response.status_code}")
        return response.text

    async def post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return _decode(await self._send("POST", path, body))

    async def open_stream(self, path: str, body: dict[str, Any]) -> EngineStream:
        pool = self._pool()
        # built directly (not client.build_request): this is per request on the hot path
        request = httpx.Request("POST", self._url(path), content=_json(body), headers=_STREAM_HEADERS)
        request.extensions["timeout"] = self._timeout
        try:
            response = await pool.client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout(f"the engine did not answer {path} in time") from exc
        except httpx.HTTPError as exc:
            raise UpstreamUnavailable(f"cannot reach the engine at {self.base_url}: {exc}") from exc
        if response.status_code != 200:
            try:
                await response.aread()
            except httpx.HTTPError:
                pass
            finally:
                await response.aclose()
            raise _status_error(response)
        pool.in_flight += 1
        return EngineStream(response, pool)

    async def _send(
        self, method: str, path: str, body: dict[str, Any] | None, *, timeout_s: float | None = None
    ) -> httpx.Response:
        extra: dict[str, Any] = {} if timeout_s is None else {"timeout": timeout_s}
        pool = self._pool()
        pool.in_flight += 1
        try:
            content = None if body is None else _json(body)
            headers = None if body is None else {"content-type": "application/json"}
            return await pool.client.request(method, path, content=content, headers=headers, **extra)
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout(f"the engine did not answer {path} in time") from exc
        except httpx.HTTPError as exc:
            raise UpstreamUnavailable(f"cannot reach the engine at {self.base_url}: {exc}") from exc
        finally:
            pool.in_flight -= 1


_STREAM_HEADERS = {
    "content-type": "application/json",
    "accept": "text/event-stream",
    "accept-encoding": "identity",
}


def _json(body: dict[str, Any]) -> bytes:
    """Strict JSON: NaN and Infinity (which Python's parser lets in) are the client's mistake."""
    try:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:
        raise InvalidRequest("the request holds NaN or Infinity, which JSON does not allow") from None


def _decode(response: httpx.Response) -> dict[str, Any]:
    if response.status_code != 200:
        raise _status_error(response)
    try:
        body = response.json()
    except ValueError as exc:
        raise UpstreamError("the engine answered with a body that is not JSON") from exc
    if not isinstance(body, dict):
        raise UpstreamError("the engine answered with JSON that is not an object")
    return body


def _status_error(response: httpx.Response) -> ApiError:
    """The engine's refusal as our error: its 4xx stay the client's, the rest are upstream failures."""
    message, param, code = f"the engine answered HTTP {response.status_code}", None, None
    try:
        info = json.loads(response.content).get("error")
        if isinstance(info, dict):
            message = str(info.get("message") or message)
            param = info.get("param") if isinstance(info.get("param"), str) else None
            code = str(info["code"]) if info.get("code") is not None else None
    except (ValueError, AttributeError):
        pass
    status = response.status_code
    if 400 <= status < 500 and status not in (408, 429):
        error: ApiError = ClientError(message, param=param, code=code)
        error.status = status
        return error
    if status == 429:
        return Overloaded(message)
    if status == 503:
        return UpstreamUnavailable(message)
    return UpstreamError(message)
