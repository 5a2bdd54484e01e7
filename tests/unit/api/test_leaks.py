"""Small leaks (issue 15, item 10): what a stranger, a log reader or an error message learns."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.fakes.harness import Running
from tests.fakes.scripted_engine import ScriptedEngine

import sparkfold
from sparkfold.cli import main

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "x"}]}


def test_many_unknown_fields_are_logged_as_a_count_and_a_few_names(
    gateway: Running, caplog: pytest.LogCaptureFixture
) -> None:
    body = {**CHAT, **{f"unknown_field_{i}": 1 for i in range(150_000)}}
    with caplog.at_level(logging.INFO):
        assert gateway.http.post("/v1/chat/completions", json=body).status_code == 200
    [record] = [r for r in caplog.records if r.getMessage() == "ignored request fields"]
    assert record.count == 150_000  # type: ignore[attr-defined]
    assert len(record.fields) <= 8  # type: ignore[attr-defined]
    assert len(json.dumps(record.__dict__, default=str)) < 4096


@pytest.fixture
def keyed(tmp_path: Path, start_gateway: Callable[..., Running]) -> Running:
    keys = tmp_path / "api-keys"
    keys.write_text("the-key\n")
    return start_gateway(api_keys_file=str(keys))


def test_health_without_a_key_says_only_ok_and_is_cached(keyed: Running, fake: ScriptedEngine) -> None:
    before = fake.health_calls
    answers = [keyed.http.get("/health") for _ in range(20)]
    assert all(a.status_code == 200 and a.json() == {"ok": True} for a in answers)
    assert fake.health_calls - before <= 2  # one engine call per cache period, not one per hit
    full = keyed.http.get("/health", headers={"Authorization": "Bearer the-key"}).json()
    assert full["engine"]["backend"] == "scripted" and full["lanes"]["total"] == 4
    # the release and commit, as `sparkfold --version` names them, only with the key
    assert full["gateway"] == {
        "ok": True,
        "version": sparkfold.__version__,
        "commit": sparkfold.__commit_id__,
    }


def test_docs_load_no_script_and_the_openapi_document_matches_the_server(keyed: Running) -> None:
    docs = keyed.http.get("/docs")
    assert (
        docs.status_code == 200 and "<script" not in docs.text and "http" not in docs.text.split("</h1>")[1]
    )
    document = keyed.http.get("/openapi.json").json()
    text = json.dumps(document)
    assert '"422"' not in text and "HTTPValidationError" not in text
    chat = document["paths"]["/v1/chat/completions"]["post"]
    assert "400" in chat["responses"]
    assert set(document["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    assert document["security"] and document["paths"]["/health"]["get"]["security"] == []
    # and the server does answer 400 where the document says so
    bad = keyed.http.post("/v1/chat/completions", json={"messages": 1}, headers={"x-api-key": "the-key"})
    assert bad.status_code == 400


def test_a_wrong_method_is_405_with_allow(gateway: Running) -> None:
    response = gateway.http.get("/v1/chat/completions")
    assert response.status_code == 405 and response.headers["allow"] == "POST"


def test_config_check_refuses_an_engine_listening_beyond_loopback(tmp_path: Path) -> None:
    config = tmp_path / "sparkfold.toml"
    config.write_text('[engine]\nmodel = "x"\nhost = "0.0.0.0"\n[api]\nhost = "127.0.0.1"\n')
    result = CliRunner().invoke(main, ["config", "check", str(config)])
    assert result.exit_code != 0 and "engine.host 0.0.0.0 is not loopback" in result.output
