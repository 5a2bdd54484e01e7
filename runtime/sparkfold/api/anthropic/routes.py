"""HTTP wiring of the Anthropic routes (errors leave in Anthropic's shape: see errors.is_anthropic_path)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from sparkfold.api.anthropic.protocol import CountTokensRequest, CountTokensResponse, MessagesRequest
from sparkfold.api.context import CallContext
from sparkfold.api.respond import respond
from sparkfold.api.state import ERROR_RESPONSES, gateway

router = APIRouter()


@router.post("/v1/messages", response_model=None, responses=ERROR_RESPONSES, tags=["anthropic"])
@router.post("/messages", include_in_schema=False)  # TensorFold's alias
async def messages(body: MessagesRequest, request: Request) -> Response:
    call = CallContext.of_scope(request.scope, request.scope["path"])
    return respond(await gateway(request).messages.create(body, call), request.scope["path"], call.headers)


@router.post("/messages/count_tokens", include_in_schema=False)
@router.post(
    "/v1/messages/count_tokens",
    response_model=CountTokensResponse,
    responses=ERROR_RESPONSES,
    tags=["anthropic"],
)
async def count_tokens(body: CountTokensRequest, request: Request) -> Response:
    call = CallContext.of_scope(request.scope, request.scope["path"])
    return respond(
        await gateway(request).messages.count_tokens(body, call), request.scope["path"], call.headers
    )
