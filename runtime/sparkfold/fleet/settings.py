"""The router host's settings: ``/etc/sparkfold/fleet.toml``, one file for both of its processes.

``[front]``    the public endpoint (``sparkfold fleet``): bind address, client keys, body limit
``[router]``   SMG on loopback (``sparkfold router``): its port, its own key, policy, health, retries
``[[pairs]]``  every pair's gateway: a name, its URL, and whether it is draining

Unknown keys are errors, as in :mod:`sparkfold.config`; :func:`load_fleet` names every bad key.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from sparkfold.config import SettingsSection, is_loopback, parse_as, read_toml

__all__ = [
    "DEFAULT_FLEET_PATH",
    "FleetSettings",
    "FrontSettings",
    "PairSettings",
    "RouterSettings",
    "load_fleet",
    "read_secret",
]

DEFAULT_FLEET_PATH = Path("/etc/sparkfold/fleet.toml")
DEFAULT_FRONT_PORT = 8800
_PAIR_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")

Policy = Literal["cache_aware", "prefix_hash", "round_robin", "power_of_two", "random"]


class FrontSettings(SettingsSection):
    """The fleet's public endpoint: our keys, checked here, and the routes SMG does not carry."""

    host: str = Field("0.0.0.0", description="bind address; keys are required unless it is loopback")
    port: int = Field(DEFAULT_FRONT_PORT, ge=1, le=65535)
    api_keys_file: Path | None = Field(None, description="client keys, one per line (plain or sha256:HEX)")
    require_keys: bool | None = Field(None, description="default: required unless host is loopback")
    max_body_mib: float = Field(96, gt=0, description="largest request body")
    upstream_timeout_s: float = Field(600.0, gt=0, description="longest silence tolerated from the router")

    @property
    def keys_required(self) -> bool:
        return self.require_keys if self.require_keys is not None else not is_loopback(self.host)


class RouterSettings(SettingsSection):
    """SMG, bound to loopback: only the front (and the operator on the host) reaches it."""

    host: str = Field("127.0.0.1", description="SMG's bind address; must be loopback")
    port: int = Field(8890, ge=1, le=65535, description="SMG's data plane")
    metrics_port: int = Field(8891, ge=1, le=65535, description="SMG's Prometheus listener (loopback)")
    key_file: Path = Field(
        Path("/etc/sparkfold/router-key"),
        description="the router's own key: SMG requires it from the front and sends it to every pair",
    )
    control_key_file: Path = Field(
        Path("/etc/sparkfold/router-control-key"), description="the key of SMG's control plane (/workers)"
    )
    workers_file: Path = Field(
        Path("/run/sparkfold-router/workers.json"),
        description="SMG's discovery manifest, written from [[pairs]] at start and on reload",
    )
    policy: Policy = Field("cache_aware", description="SMG's routing policy")
    cache_boundaries: list[int] = Field(
        default_factory=list,
        description="token positions at which the engine keeps resumable prompt state (its checkpoints)",
    )
    cache_threshold: float = Field(
        0.3, ge=0, le=1, description="matched-prefix share that pins a request to the pair holding it"
    )
    health_interval_s: int = Field(5, ge=1, description="seconds between health checks of each pair")
    health_failure_threshold: int = Field(1, ge=1, description="failed checks before a pair is ejected")
    health_success_threshold: int = Field(1, ge=1, description="passed checks before it is taken back")
    max_retries: int = Field(3, ge=1, description="attempts per request (429, 5xx, refused connections)")
    request_timeout_s: int = Field(1800, ge=1, description="longest request SMG lets run")
    extra_args: list[str] = Field(
        default_factory=list, description="further `smg launch` options, passed as given (never keys)"
    )

    @field_validator("host")
    @classmethod
    def _loopback(cls, value: str) -> str:
        if not is_loopback(value):
            raise ValueError(
                f"{value} is not loopback: SMG's control plane and data plane must stay on the router "
                "host (clients reach the fleet through [front]); use 127.0.0.1"
            )
        return value

    @field_validator("cache_boundaries")
    @classmethod
    def _ascending(cls, value: list[int]) -> list[int]:
        if any(b <= 0 for b in value) or value != sorted(set(value)):
            raise ValueError("list positive token positions in ascending order, each once")
        return value

    @field_validator("extra_args")
    @classmethod
    def _no_keys(cls, value: list[str]) -> list[str]:
        for arg in value:
            if "key" in arg.split("=", 1)[0]:
                raise ValueError(f"{arg}: keys come from key_file and control_key_file, not from options")
        return value

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"


class PairSettings(SettingsSection):
    """One pair: its gateway URL as the router reaches it."""

    name: str = Field(description="the pair's name in /health and the pair label of /metrics")
    url: str = Field(description="the pair's gateway, e.g. http://198.51.100.21:8888")
    draining: bool = Field(False, description="takes no new conversations; running streams finish")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _PAIR_NAME.match(value):
            raise ValueError(f"{value!r}: use lower-case letters, digits, '-' and '_' (at most 63)")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
            raise ValueError(f"{value!r}: give the gateway's base URL, e.g. http://198.51.100.21:8888")
        return value.rstrip("/")


class FleetSettings(SettingsSection):
    """The whole of fleet.toml."""

    front: FrontSettings = Field(default_factory=FrontSettings)
    router: RouterSettings = Field(default_factory=RouterSettings)
    pairs: list[PairSettings] = Field(min_length=1, description="the pairs behind the router")

    @model_validator(mode="after")
    def _unique(self) -> FleetSettings:
        for key in ("name", "url"):
            values = [getattr(pair, key) for pair in self.pairs]
            twice = sorted({v for v in values if values.count(v) > 1})
            if twice:
                raise ValueError(f"pairs: each {key} must appear once; repeated: {', '.join(twice)}")
        if self.front.port == self.router.port and is_loopback(self.front.host):
            raise ValueError("front.port and router.port are the same port on loopback; change one")
        return self

    @property
    def serving(self) -> list[PairSettings]:
        """The pairs that take new conversations (not draining)."""
        return [pair for pair in self.pairs if not pair.draining]


def load_fleet(path: str | Path) -> FleetSettings:
    """Read and validate fleet.toml; :class:`~sparkfold.config.ConfigError` names every bad key."""
    return parse_as(FleetSettings, read_toml(path), str(path))


def read_secret(path: Path, what: str) -> str:
    """The first non-blank line of a key file; ``ValueError`` naming the file and the fix otherwise."""
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    except OSError as exc:
        raise ValueError(f"{what} {path}: cannot read: {exc.strerror or exc}") from None
    found = next((line for line in lines if line and not line.startswith("#")), "")
    if not found:
        raise ValueError(f"{what} {path} is empty: put the key on its first line (the router role writes it)")
    return found
