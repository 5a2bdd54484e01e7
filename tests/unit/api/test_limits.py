"""Limits and bad input: each a 4xx naming the field and the limit, in the route's error shape."""

from __future__ import annotations

import base64
from collections.abc import Callable

import pytest
from tests.fakes.harness import Running
from tests.fakes.scripted_engine import ScriptedEngine


def image(n_bytes: int) -> dict[str, object]:
    data = base64.b64encode(b"\0" * n_bytes).decode()
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}


def chat(**fields: object) -> dict[str, object]:
    return {"model": "fake", "messages": [{"role": "user", "content": "x"}], **fields}


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"n": 2}, "n", "n must be 1"),
        ({"logprobs": True}, "logprobs", "logprobs are not available"),
        ({"top_logprobs": 3}, "top_logprobs", "top_logprobs"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort", "must be one of none, minimal"),
        ({"temperature": 9}, "temperature", "less than or equal to 2"),
        ({"messages": []}, "messages", "at least 1"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role", "Input should be"),
    ],
)
def test_bad_chat_fields_are_400_naming_the_field(
    gateway: Running, fields: dict[str, object], param: str, words: str
) -> None:
    response = gateway.http.post("/v1/chat/completions", json=chat(**fields))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param
    assert words in error["message"]


def test_too_many_images(start_gateway: Callable[..., Running]) -> None:
    gateway = start_gateway(max_images=2)
    content = [{"type": "text", "text": "look"}, image(10), image(10), image(10)]
    response = gateway.http.post(
        "/v1/chat/completions", json=chat(messages=[{"role": "user", "content": content}])
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "messages[0].content[3].image_url"
    assert "at most 2 per request (api.max_images)" in error["message"]


def test_image_too_large(start_gateway: Callable[..., Running]) -> None:
    gateway = start_gateway(max_image_mib=0.5)
    messages = [{"role": "user", "content": [image(600_000)]}]
    response = gateway.http.post("/v1/chat/completions", json=chat(messages=messages))
    assert response.status_code == 400
    assert "api.max_image_mib" in response.json()["error"]["message"]


def test_too_many_videos(start_gateway: Callable[..., Running]) -> None:
    gateway = start_gateway(max_videos=0)
    video = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}
    response = gateway.http.post(
        "/v1/chat/completions", json=chat(messages=[{"role": "user", "content": [video]}])
    )
    assert response.status_code == 400
    assert "api.max_videos" in response.json()["error"]["message"]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/tokenize"])
@pytest.mark.parametrize("kind", [["image_url"], {"image": 1}])
def test_a_content_part_whose_type_is_no_string_is_a_400(gateway: Running, route: str, kind: object) -> None:
    """The media count reads each part's ``type``; one that is a list or an object (schema-valid
    for ``/tokenize``, whose parts the document leaves open) was a 500 (unhashable type)."""
    parts = [{"type": kind, "image_url": {"url": "data:image/png;base64,AA=="}}]
    response = gateway.http.post(
        route, json={"model": "fake", "messages": [{"role": "user", "content": parts}]}
    )
    assert response.status_code == 400, response.text
    assert "part 0: type must be a string" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        (
            "/v1/messages",
            {"max_tokens": 8, "system": [{"type": None}], "messages": [{"role": "user", "content": "hi"}]},
            "system",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": 1}]}]},
            "messages.0.content",
        ),
    ],
)
def test_a_400_names_the_fields_of_the_request_not_the_validators_union_members(
    gateway: Running, route: str, body: dict, field: str
) -> None:
    """A content that is neither a string nor valid parts failed both members of the union: the 400
    said pydantic's names for them ("system.str: …; system.function-after[_typed_parts(), …]: …")."""
    response = gateway.http.post(route, json={"model": "fake", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["message"] == f"invalid request: {field}: part 0: type must be a string such as 'text'"
    assert error.get("param", field) == field


def test_body_past_the_limit_is_413(start_gateway: Callable[..., Running]) -> None:
    gateway = start_gateway(max_body_mib=0.01)
    response = gateway.http.post(
        "/v1/chat/completions", json=chat(messages=[{"role": "user", "content": "x" * 20000}])
    )
    assert response.status_code == 413
    assert response.json()["error"]["param"] == "body"
    assert "api.max_body_mib" in response.json()["error"]["message"]


def test_chunked_body_past_the_limit_is_413(start_gateway: Callable[..., Running]) -> None:
    gateway = start_gateway(max_body_mib=0.01)

    def chunks():  # type: ignore[no-untyped-def]
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(30):
            yield b"x" * 1000
        yield b'"}]}'

    response = gateway.http.post(
        "/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413


def test_anthropic_routes_answer_in_anthropic_shape(gateway: Running) -> None:
    response = gateway.http.post("/v1/messages", json={"model": "fake", "messages": []})
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"[]",
        b'"text"',
        b"null",
        b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
        b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"x": Infinity}}]}',
        b"[" * 100_000 + b"]" * 100_000,
        b"\xff\xfe",
    ],
)
def test_malformed_bodies_are_400(gateway: Running, raw: bytes) -> None:
    response = gateway.http.post(
        "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400, response.text
    assert "error" in response.json()


def test_unknown_route_is_a_404_json_error(gateway: Running) -> None:
    response = gateway.http.post("/v1/nothing", json={})
    assert response.status_code == 404
    assert "no route" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/chat/completions", "/v1/chat/completions"),  # openai SDK, base_url http://HOST:PORT
        ("/v1/v1/messages", "/v1/messages"),  # anthropic SDK, base_url http://HOST:PORT/v1
    ],
)
def test_a_base_url_off_by_v1_is_told_so(gateway: Running, path: str, route: str) -> None:
    response = gateway.http.post(path, json={})
    assert response.status_code == 404
    message = response.json()["error"]["message"]
    assert f"the route is {route}" in message and "base_url" in message


def test_a_method_a_path_does_not_answer_is_a_405_naming_the_ones_it_does(gateway: Running) -> None:
    """``/v1/responses/{id}`` answers GET and DELETE; the Allow header named only the first
    route's methods, and the message said only "Method Not Allowed"."""
    response = gateway.http.put("/v1/responses/resp_x")
    assert response.status_code == 405
    assert {"GET", "DELETE"} <= set(response.headers["allow"].split(", "))
    message = response.json()["error"]["message"]
    assert "PUT" in message and "DELETE" in message and "/docs" in message
    listing = gateway.http.get("/v1/chat/completions")  # openai's stored-completions list
    assert listing.status_code == 405 and listing.headers["allow"] == "POST"


def test_engine_never_sees_refused_requests(gateway: Running, fake: ScriptedEngine) -> None:
    gateway.http.post("/v1/chat/completions", json=chat(n=3))
    assert fake.requests == []
