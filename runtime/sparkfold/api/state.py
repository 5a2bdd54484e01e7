"""The gateway's long-lived objects, reachable from a request, and the error models for OpenAPI."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import Request

from sparkfold.protocol import ErrorResponse

if TYPE_CHECKING:
    from sparkfold.api.anthropic.serving import MessagesServing
    from sparkfold.api.health import HealthServing
    from sparkfold.api.keys import KeyStore
    from sparkfold.api.lanes import Lanes
    from sparkfold.api.metrics import Metrics
    from sparkfold.api.models import ModelsServing
    from sparkfold.api.openai.serving import ChatServing, CompletionServing, UtilityServing
    from sparkfold.api.responses.serving import ResponsesServing
    from sparkfold.api.upstream import Engine

__all__ = ["ERROR_RESPONSES", "Gateway", "gateway"]

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text}
    for status, text in (
        (400, "a field is malformed, unsupported or past a limit (the message names it)"),
        (401, "no or unknown API key"),
        (413, "request body larger than api.max_body_mib"),
        (429, "all lanes busy and the queue full; retry after Retry-After seconds"),
        (502, "the engine failed"),
        (503, "the engine cannot be reached"),
    )
}


@dataclass
class Gateway:
    engine: Engine
    lanes: Lanes
    tokenizer_lanes: Lanes
    metrics: Metrics
    keys: KeyStore
    chat: ChatServing
    completion: CompletionServing
    utility: UtilityServing
    models: ModelsServing
    messages: MessagesServing
    responses: ResponsesServing
    health: HealthServing


def gateway(request: Request) -> Gateway:
    found: Gateway = request.app.state.gateway
    return found
