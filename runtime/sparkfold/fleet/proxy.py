"""Pass one request through to an upstream (SMG, or a pair's gateway) and its answer back, as bytes.

The client's own key has been checked by the front already and never leaves it: the upstream gets
``Authorization: Bearer <router key>`` instead (SMG requires it, and sends the same key on to the
pairs). Everything else passes as it came — method, path, query, body, headers other than
hop-by-hop ones — and the answer comes back byte for byte, SSE streams included, through
:class:`~starlette.responses.StreamingResponse`, which stops reading the upstream (and closes it)
when the client leaves.

httpx does the HTTP: this module only chooses headers and maps transport failures to the
gateway's error shapes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from sparkfold.api.errors import ApiError, UpstreamTimeout, UpstreamUnavailable, error_response

__all__ = ["Upstream"]

# Hop-by-hop (RFC 9110 §7.6.1), the client's credentials, and what httpx sets itself.
_DROP_REQUEST = frozenset(
    {
        "authorization",
        "x-api-key",
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_DROP_RESPONSE = frozenset(
    {"connection", "keep-alive", "proxy-connection", "trailer", "transfer-encoding", "upgrade"}
)


class Upstream:
    """One upstream base URL, reached with the router's key."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, key: str, name: str) -> None:
        self.client = client
        self.base_url = base_url.rstrip("/")
        self.name = name
        self._auth = f"Bearer {key}"

    def __repr__(self) -> str:  # never the key
        return f"Upstream({self.name!r}, {self.base_url!r})"

    async def forward(self, request: Request) -> Response:
        """``request`` sent on as it came (with the router's key); the answer streamed back."""
        headers = [(k, v) for k, v in request.headers.items() if k not in _DROP_REQUEST]
        headers.append(("authorization", self._auth))
        outgoing = self.client.build_request(
            request.method,
            self.base_url + request.url.path,
            params=request.url.query,
            headers=headers,
            content=await request.body(),
        )
        try:
            reply = await self.client.send(outgoing, stream=True)
        except httpx.TimeoutException:
            return self._failed(UpstreamTimeout(f"{self.name} did not answer in time"), request)
        except httpx.TransportError as exc:
            why = f"{self.name} cannot be reached at {self.base_url} ({exc.__class__.__name__})"
            return self._failed(UpstreamUnavailable(why), request)
        return StreamingResponse(
            _body(reply),
            status_code=reply.status_code,
            headers={k: v for k, v in reply.headers.items() if k not in _DROP_RESPONSE},
            background=BackgroundTask(reply.aclose),
        )

    async def get(self, path: str, *, timeout_s: float) -> httpx.Response:
        """A small GET (health, metrics, worker lists) with the router's key; raises httpx errors."""
        return await self.client.get(
            self.base_url + path, headers={"authorization": self._auth}, timeout=timeout_s
        )

    def _failed(self, error: ApiError, request: Request) -> Response:
        return error_response(error, request.url.path)


async def _body(reply: httpx.Response) -> AsyncIterator[bytes]:
    """The upstream's bytes as they come; a cut-off upstream ends the body (the client sees it cut)."""
    try:
        async for chunk in reply.aiter_raw():
            yield chunk
    except httpx.HTTPError:
        return
    finally:
        await reply.aclose()
