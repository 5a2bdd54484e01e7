"""The gateway's OpenAPI document as the server behaves, and a ``/docs`` page that loads nothing.

FastAPI's document lists a ``422`` for every route with a body; this gateway answers validation
errors with ``400`` (:mod:`sparkfold.api.errors`), so :func:`install` rewrites them, and declares
the two ways to send an API key (``Authorization: Bearer`` and ``x-api-key``) as security
schemes, required everywhere but the open paths. FastAPI's ``/docs`` loads Swagger UI from a CDN,
which an offline pair cannot reach and a careful operator does not want: :func:`docs_page` is a
plain HTML list of the operations made from the same document, with no script.

The document says what validation accepts: a request valid by it is not refused for its shape
(the slow fuzz test in ``tests/unit/api/test_fuzz.py`` sends such requests). The wire models carry
most of it; :func:`_rewrite` adds what pydantic does not write: integer bounds by JSON Schema's
names and as integers, and the reasoning efforts.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.responses import HTMLResponse

from sparkfold.api.reasoning import EFFORTS

__all__ = ["SECURITY_SCHEMES", "docs_page", "install"]

SECURITY_SCHEMES: dict[str, dict[str, str]] = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer KEY"},
    "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key", "description": "x-api-key: KEY"},
}
_METHODS = ("get", "post", "put", "patch", "delete")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# pydantic writes a bound it applies after a function validator (protocol.Integer) by its own name
_PYDANTIC_BOUNDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}
_EFFORT_FIELDS = (("ChatCompletionRequest", "reasoning_effort"), ("TokenizeRequest", "reasoning_effort"))


def _integer_bounds(node: Any) -> None:
    """Integer schemas' bounds as JSON Schema names them, integral ones as integers, everywhere
    under ``node``."""
    if isinstance(node, dict):
        if node.get("type") == "integer":
            for ours, theirs in _PYDANTIC_BOUNDS.items():
                if ours in node:
                    node[theirs] = node.pop(ours)
            for key in _BOUNDS:
                if isinstance(node.get(key), float) and node[key].is_integer():
                    node[key] = int(node[key])
        for value in node.values():
            _integer_bounds(value)
    elif isinstance(node, list):
        for value in node:
            _integer_bounds(value)


def _rewrite(document: dict[str, Any], open_paths: frozenset[str]) -> dict[str, Any]:
    for path, item in document.get("paths", {}).items():
        for method in _METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            responses = operation.setdefault("responses", {})
            unprocessable = responses.pop("422", None)
            if unprocessable is not None and "400" not in responses:
                responses["400"] = {
                    **unprocessable,
                    "description": "a field is malformed (the message names it)",
                }
            if path in open_paths:
                operation["security"] = []
    schemas = document.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    _integer_bounds(schemas)
    for model, field in _EFFORT_FIELDS:
        if field in schemas.get(model, {}).get("properties", {}):
            schemas[model]["properties"][field] = {"anyOf": [{"enum": list(EFFORTS)}, {"type": "null"}]}
    document.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
    document["security"] = [{name: []} for name in SECURITY_SCHEMES]
    return document


def install(app: FastAPI, *, open_paths: Iterable[str]) -> None:
    """Make ``app.openapi()`` the rewritten document (built once) and serve ``/docs`` without a CDN."""
    paths = frozenset(open_paths)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            app.openapi_schema = _rewrite(document, paths)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return docs_page(openapi())


def docs_page(document: dict[str, Any]) -> HTMLResponse:
    rows = []
    for path, item in document.get("paths", {}).items():
        for method in _METHODS:
            if (operation := item.get(method)) is not None:
                summary = operation.get("summary") or operation.get("description") or ""
                rows.append(
                    f"<tr><td><code>{method.upper()}</code></td><td><code>{html.escape(path)}</code></td>"
                    f"<td>{html.escape(summary)}</td></tr>"
                )
    title = html.escape(f"{document['info']['title']} {document['info']['version']}")
    body = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head><body>"
        f"<h1>{title}</h1><p>{html.escape(document['info'].get('description', ''))}</p>"
        "<p>The whole description: <a href='/openapi.json'>/openapi.json</a> (load it into any OpenAPI "
        "viewer). Send the API key as <code>Authorization: Bearer KEY</code> or <code>x-api-key: KEY</code>."
        "</p><table>" + "".join(rows) + "</table></body></html>"
    )
    return HTMLResponse(body, headers={"content-security-policy": "default-src 'none'"})
