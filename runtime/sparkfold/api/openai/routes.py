"""HTTP wiring of the OpenAI routes: look up the serving object, call it, map the result.

The model routes are Anthropic's path too: :mod:`sparkfold.api.models` answers both dialects.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from sparkfold.api.context import CallContext
from sparkfold.api.models import wants_anthropic
from sparkfold.api.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from sparkfold.api.respond import respond
from sparkfold.api.state import ERROR_RESPONSES, gateway

router = APIRouter()


def _call(request: Request) -> CallContext:
    return CallContext.of_scope(request.scope, request.scope["path"])


@router.get("/v1/models", response_model=ModelList, responses=ERROR_RESPONSES, tags=["openai"])
@router.get("/models", include_in_schema=False)  # TensorFold's alias
async def list_models(request: Request) -> Response:
    listed = await gateway(request).models.models(anthropic=wants_anthropic(request.headers))
    return respond(listed, request.scope["path"])


@router.get(
    "/v1/models/{model_id:path}", response_model=ModelCard, responses=ERROR_RESPONSES, tags=["openai"]
)
async def get_model(model_id: str, request: Request) -> Response:
    card = await gateway(request).models.model(model_id, anthropic=wants_anthropic(request.headers))
    return respond(card, request.scope["path"])


@router.post("/v1/chat/completions", response_model=None, responses=ERROR_RESPONSES, tags=["openai"])
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    return respond(await gateway(request).chat.create(body, _call(request)), request.scope["path"])


@router.post("/v1/completions", response_model=None, responses=ERROR_RESPONSES, tags=["openai"])
async def completions(body: CompletionRequest, request: Request) -> Response:
    return respond(await gateway(request).completion.create(body, _call(request)), request.scope["path"])


@router.post("/tokenize", response_model=TokenizeResponse, responses=ERROR_RESPONSES, tags=["tokenizer"])
@router.post("/v1/tokenize", include_in_schema=False)
async def tokenize(body: TokenizeRequest, request: Request) -> Response:
    return respond(await gateway(request).utility.tokenize(body, _call(request)), request.scope["path"])


@router.post("/detokenize", response_model=DetokenizeResponse, responses=ERROR_RESPONSES, tags=["tokenizer"])
@router.post("/v1/detokenize", include_in_schema=False)
async def detokenize(body: DetokenizeRequest, request: Request) -> Response:
    return respond(await gateway(request).utility.detokenize(body, _call(request)), request.scope["path"])
