"""HTTP wiring of the routes every dialect shares: health and metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import JSONResponse, Response

from sparkfold.api.health import GatewayHealth, OpenHealth
from sparkfold.api.state import gateway

router = APIRouter()


@router.get(
    "/health",
    response_model=GatewayHealth | OpenHealth,
    responses={503: {"model": GatewayHealth | OpenHealth}},
    tags=["ops"],
    description="the whole report with an accepted API key (or where keys are off); only `ok` without",
)
@router.get("/v1/health", include_in_schema=False)  # TensorFold's alias
async def health(request: Request) -> Response:
    serving = gateway(request).health
    trusted = request.scope.get("state", {}).get("trusted", False)
    report = await serving.health() if trusted else await serving.open_health()
    return JSONResponse(report.model_dump(mode="json"), status_code=200 if report.ok else 503)


@router.get("/metrics", response_class=Response, tags=["ops"])
@router.get("/v1/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    return Response(await gateway(request).health.metrics_text(), media_type=CONTENT_TYPE_LATEST)
