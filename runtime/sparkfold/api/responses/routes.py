"""HTTP wiring of ``/v1/responses``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from sparkfold.api.context import CallContext
from sparkfold.api.respond import respond
from sparkfold.api.responses.protocol import ResponsesRequest
from sparkfold.api.state import ERROR_RESPONSES, gateway

router = APIRouter()


@router.post("/v1/responses", response_model=None, responses=ERROR_RESPONSES, tags=["openai"])
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    call = CallContext.of_scope(request.scope, request.scope["path"])
    return respond(await gateway(request).responses.create(body, call), request.scope["path"], call.headers)


@router.get("/v1/responses/{response_id}", response_model=None, responses=ERROR_RESPONSES, tags=["openai"])
async def get_response(response_id: str, request: Request) -> Response:
    call = CallContext.of_scope(request.scope, request.scope["path"])
    return respond(gateway(request).responses.get(response_id, call), request.scope["path"])


@router.delete("/v1/responses/{response_id}", response_model=None, responses=ERROR_RESPONSES, tags=["openai"])
async def delete_response(response_id: str, request: Request) -> Response:
    call = CallContext.of_scope(request.scope, request.scope["path"])
    return respond(gateway(request).responses.delete(response_id, call), request.scope["path"])
