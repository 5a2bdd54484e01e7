"""Generated requests against every operation in /openapi.json: never a 5xx, never a crash, and
never a request the document calls valid refused for its shape.

Schemathesis builds valid and invalid requests from the gateway's own OpenAPI document; the
gateway runs for real (uvicorn, loopback) in front of the scripted engine. At least 1,000
requests are sent in all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

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


# Refusals of a request valid by the document that JSON Schema cannot rule out, each for its reason.
BEYOND_THE_SCHEMA = {
    # a reference to another item: a tool result must answer a call the conversation made
    "is the id of no tool call": "reference",
    "is the id of no tool_use block": "reference",
    "no function call found for the function_call_output": "reference",
    "more than one tool is offered as": "names unique across the list",
    # the place of an item: the last message must not be the assistant's (no prefill)
    "a final assistant turn (a prefill)": "place",
    # input items that make no chat message at all (only reasoning items)
    "messages: List should have at least 1 item": "place",
    # a signature: only this server's blobs open
    "not an encrypted_content this server wrote": "signature",
    # what the engine in use can do (its /v1/models card): the scripted engine has no logprobs, n > 1
    "from the test engine": "engine",
    "with the test engine": "engine",
    "the test engine takes one prompt": "engine",
}
POSITIVE_PER_OPERATION = 60


def _cases(operation: Any, mode: GenerationMode, examples: int) -> list[schemathesis.Case]:
    found: list[schemathesis.Case] = []

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,  # the same requests every run: a failure is a finding, never a fluke
        suppress_health_check=list(HealthCheck),
    )
    def collect(case: schemathesis.Case) -> None:
        found.append(case)

    collect()
    return found


@pytest.mark.slow
def test_requests_valid_by_the_document_are_not_refused_for_their_shape(gateway_url: str) -> None:
    """The document says what validation accepts: a 400 for a generated valid request is a field
    the document advertises and the gateway refuses (Anthropic server tools and Responses hosted
    tools were), unless its message is one of BEYOND_THE_SCHEMA; and a valid request is never a
    server error."""
    schema = schemathesis.openapi.from_url(gateway_url + "/openapi.json")
    refused: list[str] = []
    server_errors: list[str] = []
    sent = 0
    with httpx.Client(base_url=gateway_url, timeout=30) as http:
        for result in schema.get_all_operations():
            operation = result.ok()
            for case in _cases(operation, GenerationMode.POSITIVE, POSITIVE_PER_OPERATION):
                kwargs = case.as_transport_kwargs(base_url=gateway_url)
                try:
                    response = http.request(
                        kwargs["method"],
                        kwargs["url"],
                        headers=kwargs.get("headers"),
                        json=kwargs.get("json"),
                    )
                except httpx.LocalProtocolError:  # a header httpx will not send
                    continue
                sent += 1
                if response.status_code >= 500:
                    server_errors.append(
                        f"{case.method} {case.path} -> {response.status_code}: {response.text[:200]}"
                    )
                if response.status_code != 400:
                    continue
                message = response.json()["error"]["message"]
                if not any(known in message for known in BEYOND_THE_SCHEMA):
                    refused.append(f"{case.method} {case.path}: {message[:160]}")
    print(f"positive fuzz: {sent} requests, {len(refused)} refused for their shape")
    assert server_errors == []
    assert refused == []
