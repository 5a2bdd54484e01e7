"""The Responses store: bounded in bytes (per entry and in all), no media kept, scoped to its tenant."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.fakes.harness import Running
from tests.fakes.scripted_engine import Script, ScriptedEngine

from sparkfold.api.responses.store import MEDIA_NOTE, ResponseStore


def response(n: int) -> dict[str, Any]:
    return {"id": f"resp-{n}", "object": "response", "output": []}


def text_message(size: int) -> dict[str, Any]:
    return {"role": "user", "content": "x" * size}


def test_the_store_drops_the_oldest_past_its_byte_budget() -> None:
    store = ResponseStore(1000, max_entry_bytes=10_000, max_bytes=25_000)
    for n in range(10):
        assert store.put(response(n), [text_message(9_000)])
    assert store.bytes <= 25_000 and len(store) == 2
    assert store.get("resp-9") is not None and store.get("resp-0") is None
    store.delete("resp-9")
    store.delete("resp-8")
    assert store.bytes == 0


def test_an_entry_past_its_own_budget_is_not_kept() -> None:
    store = ResponseStore(max_entry_bytes=1000)
    assert not store.put(response(1), [text_message(2000)])
    assert store.get("resp-1") is None and store.bytes == 0


def test_pictures_are_not_kept_in_the_conversation() -> None:
    picture = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100_000}}
    store = ResponseStore()
    store.put(response(1), [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, picture]}])
    kept = store.conversation("resp-1")
    assert kept is not None and kept[0]["content"][1] == {"type": "text", "text": MEDIA_NOTE}
    assert store.bytes < 1000


@pytest.fixture
def two_tenants(tmp_path: Path, start_gateway: Callable[..., Running]) -> Running:
    keys = tmp_path / "api-keys"
    keys.write_text("key-of-alice\nkey-of-bob\n")
    return start_gateway(api_keys_file=str(keys))


def as_(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_stored_response_belongs_to_the_key_that_made_it(
    two_tenants: Running, fake: ScriptedEngine
) -> None:
    http = two_tenants.http
    fake.queue(Script(content=["secret"]))
    made = http.post("/v1/responses", json={"model": "fake", "input": "hi"}, headers=as_("key-of-alice"))
    assert made.status_code == 200, made.text
    rid = made.json()["id"]

    bob = as_("key-of-bob")
    assert http.get(f"/v1/responses/{rid}", headers=bob).status_code == 404
    follow = http.post(
        "/v1/responses", json={"model": "fake", "input": "more", "previous_response_id": rid}, headers=bob
    )
    assert follow.status_code == 404 and "secret" not in follow.text
    assert http.delete(f"/v1/responses/{rid}", headers=bob).status_code == 404

    alice = as_("key-of-alice")
    assert http.get(f"/v1/responses/{rid}", headers=alice).json()["id"] == rid
    assert http.delete(f"/v1/responses/{rid}", headers=alice).status_code == 200


def test_a_stored_picture_request_keeps_no_picture(gateway: Running, fake: ScriptedEngine) -> None:
    data = base64.b64encode(b"\x89PNG" + b"\0" * 300_000).decode()
    content = [
        {"type": "input_text", "text": "what is it?"},
        {"type": "input_image", "image_url": f"data:image/png;base64,{data}"},
    ]
    fake.queue(Script(content=["a square"]))
    made = gateway.http.post(
        "/v1/responses", json={"model": "fake", "input": [{"role": "user", "content": content}]}
    )
    assert made.status_code == 200, made.text
    store = gateway.app.gateway.responses.store
    assert len(store) == 1 and store.bytes < 50_000
