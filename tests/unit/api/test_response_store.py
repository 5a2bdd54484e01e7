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
from sparkfold.config import ApiSettings
from sparkfold.units import MIB


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
    store = ResponseStore(8, max_entry_bytes=1000, max_bytes=10_000)
    assert not store.put(response(1), [text_message(2000)])
    assert store.get("resp-1") is None and store.bytes == 0
    assert store.refused("resp-1") is not None and store.refused("resp-1", tenant="another key") is None
    for n in range(2, 12):  # what is remembered of refused ones is bounded by the count too
        store.put(response(n), [text_message(2000)])
    assert store.refused("resp-1") is None and store.refused("resp-11") is not None


def test_a_conversation_of_a_full_window_is_kept_by_the_default_store() -> None:
    """1.5 million CJK characters (about a 1,048,576-token window) as the store measures them, JSON
    with 6-byte escapes: ~9 MiB. The 4 MiB default answered the reply and dropped it, so a
    previous_response_id continuation of a long conversation was a 404."""
    store = ResponseStore.from_settings(ApiSettings())
    assert store.put(response(1), [{"role": "user", "content": "汉" * 1_500_000}])
    assert store.bytes > 8 * MIB and store.conversation("resp-1") is not None


def test_pictures_are_not_kept_in_the_conversation() -> None:
    picture = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100_000}}
    store = ResponseStore.from_settings(ApiSettings())
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


def test_continuing_a_response_too_large_to_keep_says_why(
    start_gateway: Callable[..., Running], fake: ScriptedEngine
) -> None:
    http = start_gateway(max_stored_response_mib=0.01).http  # 10 KiB
    fake.queue(Script(content=["read"]))
    made = http.post("/v1/responses", json={"model": "fake", "input": "x " * 20_000})
    assert made.status_code == 200, made.text
    rid = made.json()["id"]
    follow = http.post("/v1/responses", json={"model": "fake", "input": "and?", "previous_response_id": rid})
    assert follow.status_code == 404
    assert "not stored" in follow.text and "api.max_stored_response_mib" in follow.text
    assert "api.max_stored_response_mib" in http.get(f"/v1/responses/{rid}").text
    never = {"model": "fake", "input": "?", "previous_response_id": "resp_x"}
    unknown = http.post("/v1/responses", json=never)
    assert unknown.status_code == 404 and "never stored" in unknown.text
