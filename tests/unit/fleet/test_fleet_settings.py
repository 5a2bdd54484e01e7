"""fleet.toml: defaults, and each bad value named with what to change."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkfold.config import ConfigError
from sparkfold.fleet.router import manifest, router_argv
from sparkfold.fleet.settings import FleetSettings, load_fleet, read_secret

PAIRS = '[[pairs]]\nname = "a"\nurl = "http://198.51.100.21:8888"\n[[pairs]]\nname = "b"\nurl = "http://198.51.100.31:8888/"\n'


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return path


def test_a_minimal_file_takes_the_defaults(tmp_path: Path) -> None:
    fleet = load_fleet(write(tmp_path, PAIRS))
    assert fleet.front.port == 8800 and fleet.front.keys_required
    assert fleet.router.url == "http://127.0.0.1:8890" and fleet.router.policy == "cache_aware"
    assert [p.url for p in fleet.pairs] == ["http://198.51.100.21:8888", "http://198.51.100.31:8888"]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[router]\nhost = "0.0.0.0"\n' + PAIRS, "router.host: 0.0.0.0 is not loopback"),
        ("[router]\ncache_boundaries = [4096, 2048]\n" + PAIRS, "router.cache_boundaries: list positive"),
        ('[router]\nextra_args = ["--api-key=x"]\n' + PAIRS, "router.extra_args: --api-key=x: keys come"),
        (PAIRS.replace('"b"', '"a"'), "pairs: each name must appear once; repeated: a"),
        (PAIRS.replace('"b"', '"B x"'), "pairs.1.name: 'B x': use lower-case"),
        (PAIRS.replace("http://198.51.100.21:8888", "198.51.100.21"), "pairs.0.url: '198.51.100.21': give"),
        ("[front]\nport = 8800\n", "pairs: required key is missing"),
        ('[front]\nhots = "x"\n' + PAIRS, "front.hots: unknown key"),
    ],
)
def test_bad_values_are_named(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_fleet(write(tmp_path, text))
    assert named in str(caught.value)


def test_the_router_command_line_holds_no_key_and_the_manifest_no_draining_pair(tmp_path: Path) -> None:
    fleet = load_fleet(
        write(tmp_path, "[router]\ncache_boundaries = [2048, 4096]\n" + PAIRS + "draining = true\n")
    )
    argv = router_argv(fleet)
    assert not any("key" in arg for arg in argv)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--cache-boundaries") + 1] == "2048,4096"
    assert argv[argv.index("--discovery-file") + 1] == "/run/sparkfold-router/workers.json"
    assert manifest(fleet.serving) == {
        "version": 1,
        "workers": [{"id": "a", "url": "http://198.51.100.21:8888"}],
    }


def test_smg_accepts_the_command_line(tmp_path: Path) -> None:
    launch = pytest.importorskip("smg.launch_router")
    fleet = FleetSettings.model_validate({"pairs": [{"name": "a", "url": "http://127.0.0.1:1"}]})
    args = launch.parse_router_args(router_argv(fleet))
    assert args.policy == "cache_aware" and args.health_check_interval_secs == 5


def test_an_empty_key_file_is_refused_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "k").write_text("# nothing\n\n")
    with pytest.raises(ValueError, match="is empty: put the key on its first line"):
        read_secret(tmp_path / "k", "the router key file")
    (tmp_path / "k").write_text("\nsecret\n")
    assert read_secret(tmp_path / "k", "x") == "secret"


def test_the_front_refuses_to_start_off_loopback_without_keys_and_says_how(tmp_path: Path) -> None:
    """The front and the gateway share one key check (``api.server.require_keys``)."""
    from sparkfold.api.server import GatewayRefused
    from sparkfold.fleet.server import check_front

    absent = tmp_path / "fleet-api-keys"
    fleet = load_fleet(write(tmp_path, f'[front]\nhost = "0.0.0.0"\napi_keys_file = "{absent}"\n' + PAIRS))
    with pytest.raises(GatewayRefused) as refused:
        check_front(fleet)
    message = str(refused.value)
    assert "because front.host 0.0.0.0 is not loopback" in message and str(absent) in message
    assert "front.api_keys_file" in message and "bind front.host to 127.0.0.1" in message
    absent.write_text("sha256:" + "ab" * 32 + "\n")
    check_front(fleet)
