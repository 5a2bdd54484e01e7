"""The generating routes, called without FastAPI's per-request layers.

FastAPI declares every route (it makes ``/openapi.json`` and ``/docs`` from them) and serves all
but the few that make the engine generate. Those carry the load, and there FastAPI's layers
(its middleware stack, route matching over every route, dependency solving, the exception
wrapper around each streamed ``send``) cost more CPU than the rest of the gateway together.
:class:`Dispatch` finds those routes' endpoints in the FastAPI app, matches the path with one
dict lookup, reads and validates the JSON body the way FastAPI does (same checks, same 400
messages, see :func:`parse_body`), and calls the same endpoint function. Everything else goes to
FastAPI unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.responses import Response
from starlette.types import Scope

from sparkfold.api.errors import ClientError, InvalidRequest, error_response, invalid_fields
from sparkfold.asgi import DirectRoutes

__all__ = ["Dispatch", "parse_body"]


def _content_type(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return str(value.decode("latin-1"))
    return None


def _is_json(content_type: str | None) -> bool:
    if content_type is None:
        return False
    main, _, sub = content_type.partition(";")[0].strip().lower().partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


def parse_body(model: type[BaseModel], body: bytes, content_type: str | None) -> BaseModel | ClientError:
    """``body`` validated as ``model``, or the 400 FastAPI would answer (FastAPI's rules: only a
    JSON content type is parsed as JSON; anything else is validated as raw bytes, and fails)."""
    try:
        data: Any = None
        if body:
            data = json.loads(body) if _is_json(content_type) else body
        if data is None:
            return invalid_fields([{"loc": ("body",), "msg": "Field required"}])
        return model.model_validate(data, from_attributes=True)
    except json.JSONDecodeError as exc:
        return invalid_fields([{"loc": ("body", exc.pos), "msg": "JSON decode error"}])
    except ValidationError as exc:
        return invalid_fields(exc.errors(include_url=False))
    except RecursionError:
        return InvalidRequest("the JSON body nests too deeply")
    except ValueError:  # not UTF-8, and the like
        return ClientError("There was an error parsing the body")


class _Direct:
    """One FastAPI route taking exactly a pydantic body and the Request."""

    __slots__ = ("body_name", "endpoint", "model", "request_name")

    def __init__(self, route: APIRoute) -> None:
        dependant = route.dependant
        others = (
            dependant.path_params,
            dependant.query_params,
            dependant.header_params,
            dependant.cookie_params,
            dependant.dependencies,
        )
        if len(dependant.body_params) != 1 or not dependant.request_param_name or any(others):
            raise ValueError(f"{route.path}: only (body: Model, request: Request) endpoints run directly")
        field = dependant.body_params[0]
        model = field.field_info.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise ValueError(f"{route.path}: the body must be a pydantic model")
        self.model = model
        self.body_name = field.name
        self.request_name = dependant.request_param_name
        self.endpoint = route.endpoint

    async def handle(self, request: Request) -> Response:
        """Validate the body as FastAPI would (400 in the route's dialect), then call the endpoint."""
        body = request.scope.get("state", {}).get("body")  # BodyLimit read it already
        if body is None:
            body = await request.body()
        parsed = parse_body(self.model, body, _content_type(request.scope))
        if isinstance(parsed, ClientError):
            return error_response(parsed, request.scope["path"])
        response: Response = await self.endpoint(**{self.body_name: parsed, self.request_name: request})
        return response


class Dispatch(DirectRoutes):
    """ASGI: POSTs to ``paths`` run their FastAPI endpoint directly; the rest go to ``app``."""

    def __init__(self, app: FastAPI, *, routes: Iterable[Any], paths: Iterable[str]) -> None:
        wanted = frozenset(paths)
        found = {
            route.path: _Direct(route)
            for route in routes
            if isinstance(route, APIRoute) and route.path in wanted and "POST" in (route.methods or ())
        }
        if missing := wanted - found.keys():
            raise ValueError(f"no POST route for {sorted(missing)}")
        super().__init__(app, {path: direct.handle for path, direct in found.items()})
