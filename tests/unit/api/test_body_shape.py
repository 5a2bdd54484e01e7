"""Amplification before admission: bodies whose parse would cost far more than their size are 413s."""

from __future__ import annotations

import base64
import json

from tests.fakes.harness import Running
from tests.fakes.scripted_engine import ScriptedEngine

from sparkfold.api.body_shape import PRECISE_STRINGS, BodyShape, data_url_bytes, values_outside_strings
from sparkfold.config import ApiSettings

MIB = 1 << 20


def test_data_urls_are_measured_without_parsing() -> None:
    body = b'{"a": "data:image/png;base64,AAAA", "b": "text", "c": "data:x,y"}'
    assert data_url_bytes(body) == len(b'"data:image/png;base64,AAAA"') + len(b'"data:x,y"')


def test_the_shape_counts_text_apart_from_media_and_values_everywhere() -> None:
    shape = BodyShape(max_text_bytes=1000, max_values=100)
    picture = b'{"url": "data:image/png;base64,' + b"A" * 10_000 + b'"}'
    assert shape.check(picture) is None
    assert "api.max_text_body_mib" in (shape.check(b'{"t": "' + b"x" * 2000 + b'"}') or "")
    assert "api.max_json_values" in (shape.check(b"[" + b"{}," * 200 + b"{}]") or "")


def test_a_body_of_empty_tools_is_refused_before_it_is_parsed(gateway: Running, fake: ScriptedEngine) -> None:
    # 4 MiB of {} (under the text budget) would be 1.4 million dicts once parsed
    body = b'{"model": "fake", "messages": [{"role": "user", "content": "x"}], "tools": ['
    body += b"{}," * (4 * MIB // 3) + b"{}]}"
    response = gateway.http.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413 and "api.max_json_values" in response.text
    text = b'{"model": "fake", "messages": [{"role": "user", "content": "' + b"x" * (33 * MIB) + b'"}]}'
    response = gateway.http.post(
        "/v1/chat/completions", content=text, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413 and "api.max_text_body_mib" in response.text
    assert fake.requests == []


def test_a_large_picture_is_not_text(gateway: Running, fake: ScriptedEngine) -> None:
    data = base64.b64encode(b"\0" * (9 * MIB)).decode()
    part = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}
    body = {"model": "fake", "messages": [{"role": "user", "content": [part]}]}
    response = gateway.http.post("/v1/chat/completions", json=body)
    assert "api.max_text_body_mib" not in response.text and "api.max_json_values" not in response.text


def test_a_full_window_of_escaped_non_ascii_text_fits_the_default_shape() -> None:
    """1.5 million CJK characters (about a 1,048,576-token window) as Python's ``json.dumps``
    sends them by default: 6 bytes each (``\\uXXXX``), ~9 MiB. The 8 MiB default refused it."""
    api = ApiSettings()
    shape = BodyShape(max_text_bytes=int(api.max_text_body_mib * MIB), max_values=api.max_json_values)
    body = json.dumps({"model": "glm", "messages": [{"role": "user", "content": "汉" * 1_500_000}]}).encode()
    assert len(body) > 8 * MIB
    assert shape.check(body) is None


def test_a_full_window_of_csv_fits_the_default_shape() -> None:
    """A 1,048,576-token window of numbers: 250,000 CSV rows hold 2.25 million commas, all inside
    the prompt's string; the upper bound alone refused it (api.max_json_values, 524,288)."""
    api = ApiSettings()
    shape = BodyShape(max_text_bytes=int(api.max_text_body_mib * MIB), max_values=api.max_json_values)
    rows = "\n".join(",".join(str((row * 7 + col) % 1000) for col in range(10)) for row in range(250_000))
    body = json.dumps({"model": "glm", "messages": [{"role": "user", "content": "Sum column 3:\n" + rows}]})
    assert body.count(",") > api.max_json_values
    assert shape.check(body.encode()) is None


def test_values_outside_strings_honour_escapes_and_keep_the_bound_past_the_walk() -> None:
    body = json.dumps({"a": 'say "x, y", [z]\\', "b": [1, 2, {"c": "{,}"}]}).encode()
    assert values_outside_strings(body) == 6  # { , [ , , {
    shape = BodyShape(max_text_bytes=MIB, max_values=1024)
    hidden = b'["' + b"," * 4096 + b'"' + b', "x"' * 1000 + b"]"
    assert shape.check(hidden) is None  # 1,000 values outside its strings
    many = b"[" + b",".join([b'","'] * (PRECISE_STRINGS + 1)) + b"]"
    assert values_outside_strings(many) is None
    assert "api.max_json_values" in (BodyShape(max_text_bytes=MIB, max_values=65_536).check(many) or "")
