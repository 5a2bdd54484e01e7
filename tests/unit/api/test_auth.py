"""API keys: plain or hashed lines, Bearer or x-api-key, /health open, refusal to start unprotected."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.fakes.harness import Running, settings_for

from sparkfold.api.keys import KeyFileError, KeyStore, hash_key
from sparkfold.api.server import GatewayRefused, check_keys
from sparkfold.cli import main


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "api-keys"
    path.write_text(f"# operators\nplain-key-1\n\n{hash_key('hashed-key-2')}\n")
    return path


def test_keystore_accepts_plain_and_hashed_lines(keys_file: Path) -> None:
    store = KeyStore(keys_file)
    assert len(store) == 2
    assert store.accepts("plain-key-1") and store.accepts("hashed-key-2")
    assert not store.accepts("sha256:" + "0" * 64) and not store.accepts("")
    assert "plain-key-1" not in repr(store)


def test_keystore_reload_keeps_old_keys_on_a_bad_file(keys_file: Path) -> None:
    store = KeyStore(keys_file)
    keys_file.write_text("new-key\n")
    assert store.reload() == 1 and store.accepts("new-key") and not store.accepts("plain-key-1")
    keys_file.write_text("sha256:nothex\n")
    with pytest.raises(KeyFileError, match=":1: 'sha256:' must be followed by 64 hex digits"):
        store.reload()
    assert store.accepts("new-key")


def test_requests_need_an_accepted_key(start_gateway: Callable[..., Running], keys_file: Path) -> None:
    gateway = start_gateway(api_keys_file=str(keys_file))
    assert gateway.http.get("/v1/models").status_code == 401
    assert "no API key" in gateway.http.get("/v1/models").json()["error"]["message"]
    assert gateway.http.get("/v1/models", headers={"authorization": "Bearer wrong"}).status_code == 401
    assert gateway.http.get("/v1/models", headers={"authorization": "Bearer plain-key-1"}).status_code == 200
    assert gateway.http.get("/v1/models", headers={"x-api-key": "hashed-key-2"}).status_code == 200
    assert gateway.http.get("/health").status_code == 200
    anthropic = gateway.http.post("/v1/messages", json={})
    assert anthropic.status_code == 401 and anthropic.json()["error"]["type"] == "authentication_error"


def test_keys_required_off_loopback_refuse_to_start(tmp_path: Path) -> None:
    settings = settings_for(1, host="0.0.0.0", api_keys_file=str(tmp_path / "absent"))
    with pytest.raises(
        GatewayRefused, match=r"API keys are required because api\.host 0\.0\.0\.0 is not loopback"
    ):
        check_keys(settings)


def test_cli_refuses_in_one_line_saying_how_to_add_a_key(tmp_path: Path) -> None:
    config = tmp_path / "sparkfold.toml"
    config.write_text('[engine]\nmodel = "x"\n[api]\nhost = "0.0.0.0"\nport = 1\n')
    result = CliRunner().invoke(main, ["api", "--config", str(config)])
    assert result.exit_code == 1
    assert "secrets.token_urlsafe" in result.output and "Traceback" not in result.output


def test_cors_preflight_needs_no_key_and_only_allowed_origins_get_headers(
    start_gateway: Callable[..., Running], keys_file: Path
) -> None:
    gateway = start_gateway(api_keys_file=str(keys_file), cors_allowed_origins=["https://app.example"])
    ask = {
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization,content-type",
    }
    allowed = gateway.http.options("/v1/chat/completions", headers={"origin": "https://app.example", **ask})
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in allowed.headers["access-control-allow-methods"]
    other = gateway.http.options("/v1/chat/completions", headers={"origin": "https://evil.example", **ask})
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    keyed = {"origin": "https://app.example", "authorization": "Bearer plain-key-1"}
    real = gateway.http.get("/v1/models", headers=keyed)
    assert real.status_code == 200 and real.headers["access-control-allow-origin"] == "https://app.example"
    refused = gateway.http.get("/v1/models", headers={"origin": "https://app.example"})
    assert (
        refused.status_code == 401 and refused.headers["access-control-allow-origin"] == "https://app.example"
    )


def test_no_cors_headers_unless_configured(gateway: Running) -> None:
    reply = gateway.http.get("/v1/models", headers={"origin": "https://app.example"})
    assert "access-control-allow-origin" not in reply.headers


PREFLIGHT = {
    "origin": "https://app.example",
    "access-control-request-method": "POST",
    "access-control-request-headers": "authorization,content-type",
}


def test_a_preflight_is_never_refused_for_want_of_a_key_even_with_cors_off(
    start_gateway: Callable[..., Running], keys_file: Path
) -> None:
    """A browser sends a preflight without credentials: with CORS off it gets what a Starlette app
    without CORSMiddleware answers (405, no CORS headers: the browser refuses the call), not a 401."""
    gateway = start_gateway(api_keys_file=str(keys_file))
    preflight = gateway.http.options("/v1/chat/completions", headers=PREFLIGHT)
    assert preflight.status_code == 405, preflight.text
    assert "cors_allowed_origins" in preflight.json()["error"]["message"]
    assert not any(name.startswith("access-control-") for name in preflight.headers)
    plain = gateway.http.options("/v1/chat/completions", headers={"origin": "https://app.example"})
    assert plain.status_code == 401  # an OPTIONS that is no preflight still needs a key
    post = gateway.http.post("/v1/chat/completions", headers=PREFLIGHT, json={})
    assert post.status_code == 401  # preflight headers on another method open nothing
