"""Generated requests against every operation in /openapi.json: never a 5xx, never a crash.

Schemathesis builds valid and invalid requests from the gateway's own OpenAPI document; the
gateway runs for real (uvicorn, loopback) in front of the scripted engine. At least 1,000
requests are sent in all.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation import GenerationMode
from tests.fakes.harness import settings_for
from tests.fakes.scripted_engine import ScriptedEngine, ServerThread

from sparkfold.api import create_app

PER_OPERATION = 70  # x 2 modes x 11 operations, less hypothesis' early stops: well past 1,000
MINIMUM_REQUESTS = 1000


@pytest.fixture(scope="module")
def gateway_url() -> Iterator[str]:
    with ServerThread(ScriptedEngine()) as engine, ServerThread(create_app(settings_for(engine.port))) as gw:
        yield gw.url


@pytest.mark.slow
def test_generated_requests_never_get_a_server_error(gateway_url: str) -> None:
    schema = schemathesis.openapi.from_url(gateway_url + "/openapi.json")
    sent = 0
    server_errors: list[str] = []
    with httpx.Client(base_url=gateway_url, timeout=30) as http:
        for result in schema.get_all_operations():
            operation = result.ok()
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

                @given(case=operation.as_strategy(generation_mode=mode))
                @settings(
                    max_examples=PER_OPERATION,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                )
                def exercise(case: schemathesis.Case) -> None:
                    nonlocal sent
                    kwargs = case.as_transport_kwargs(base_url=gateway_url)
                    try:
                        response = http.request(
                            kwargs["method"],
                            kwargs["url"],
                            params=kwargs.get("params"),
                            headers=kwargs.get("headers"),
                            json=kwargs.get("json"),
                            content=kwargs.get("data")
                            if isinstance(kwargs.get("data"), bytes | str)
                            else None,
                        )
                    except (
                        httpx.LocalProtocolError
                    ):  # a header httpx will not send (from the security schemes)
                        return
                    sent += 1
                    if response.status_code >= 500 and case.path != "/health":
                        server_errors.append(
                            f"{case.method} {case.path} -> {response.status_code}: {response.text[:200]}"
                        )

                try:
                    exercise()
                except Unsatisfiable:  # no invalid input exists (an operation without parameters)
                    assert mode is GenerationMode.NEGATIVE
        assert http.get("/health").status_code == 200  # still alive
    assert server_errors == []
    print(f"fuzz: {sent} requests")
    assert sent >= MINIMUM_REQUESTS, sent
