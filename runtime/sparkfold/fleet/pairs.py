"""Which pairs are in, and the fleet's metrics: SMG's view of its workers joined with each pair's own.

A pair is **in** when SMG lists it as a healthy worker (``GET /workers`` on SMG's control plane):
that is the set new requests are routed to. A draining pair is not in SMG's manifest, so it is
never in; its running streams still finish. ``/metrics`` is every pair's ``/metrics`` with a
``pair`` label added, the sums over pairs as ``pair="all"``, whether each pair is in, and SMG's
own metrics (``smg_*``) after them.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString
from pydantic import BaseModel, Field

from sparkfold.fleet.proxy import Upstream
from sparkfold.fleet.settings import PairSettings

__all__ = ["FleetHealth", "FleetView", "PairReport", "relabel"]

PROBE_TIMEOUT_S = 3.0


class PairReport(BaseModel):
    name: str
    url: str
    in_rotation: bool = Field(serialization_alias="in", description="SMG routes new requests to it")
    draining: bool = Field(description="left out of SMG's manifest: no new conversations")
    router_healthy: bool | None = Field(description="SMG's health check verdict; null when SMG lists it not")
    gateway: dict[str, Any] = Field(description="the pair's own /health, or ok=false and the error")


class FleetHealth(BaseModel):
    ok: bool = Field(description="the router answers and at least one pair is in")
    pairs_in: int
    router: dict[str, Any]
    pairs: list[PairReport]


class FleetView:
    """Reads SMG's worker list and the pairs' health and metrics (all with the router's keys)."""

    def __init__(
        self, *, router: Upstream, control: Upstream, metrics: Upstream, pairs: dict[str, Upstream]
    ) -> None:
        self.router = router
        self.control = control  # SMG with the control-plane key
        self.metrics_source = metrics
        self.pairs = pairs
        self.settings: list[PairSettings] = []

    async def workers(self) -> dict[str, bool]:
        """SMG's workers: ``{url: healthy}``; raises httpx errors when SMG cannot be asked."""
        reply = await self.control.get("/workers", timeout_s=PROBE_TIMEOUT_S)
        reply.raise_for_status()
        return {w["url"].rstrip("/"): bool(w.get("is_healthy")) for w in reply.json().get("workers", [])}

    async def pairs_in(self) -> list[PairSettings]:
        """The pairs SMG routes to now, in inventory order (empty when SMG cannot be asked)."""
        try:
            workers = await self.workers()
        except (httpx.HTTPError, ValueError):
            return []
        return [p for p in self.settings if workers.get(p.url) and not p.draining]

    async def health(self) -> FleetHealth:
        router: dict[str, Any] = {"url": self.router.base_url, "ok": True}
        try:
            workers: dict[str, bool] = await self.workers()
        except (httpx.HTTPError, ValueError) as exc:
            workers, router = {}, {**router, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        gateways = await asyncio.gather(*(self._gateway_health(p) for p in self.settings))
        reports = [
            PairReport(
                name=pair.name,
                url=pair.url,
                in_rotation=bool(workers.get(pair.url)) and not pair.draining,
                draining=pair.draining,
                router_healthy=workers.get(pair.url),
                gateway=gateway,
            )
            for pair, gateway in zip(self.settings, gateways, strict=True)
        ]
        count = sum(r.in_rotation for r in reports)
        return FleetHealth(ok=router["ok"] and count > 0, pairs_in=count, router=router, pairs=reports)

    async def _gateway_health(self, pair: PairSettings) -> dict[str, Any]:
        try:
            reply = await self.pairs[pair.name].get("/health", timeout_s=PROBE_TIMEOUT_S)
            body: dict[str, Any] = reply.json()
            return {"ok": bool(body.get("ok")), "status": reply.status_code}
        except (httpx.HTTPError, ValueError) as exc:
            return {"ok": False, "error": f"{type(exc).__name__}"}

    async def metrics_text(self) -> str:
        health = await self.health()
        texts = await asyncio.gather(*(self._text(self.pairs[p.name], "/metrics") for p in self.settings))
        smg = await self._text(self.metrics_source, "")
        lines = [
            "# HELP sparkfold_fleet_pair_in 1 when the router sends new requests to the pair",
            "# TYPE sparkfold_fleet_pair_in gauge",
            *(f'sparkfold_fleet_pair_in{{pair="{r.name}"}} {int(r.in_rotation)}' for r in health.pairs),
            "# HELP sparkfold_fleet_pairs_in pairs the router sends new requests to",
            "# TYPE sparkfold_fleet_pairs_in gauge",
            f"sparkfold_fleet_pairs_in {health.pairs_in}",
        ]
        by_pair = {p.name: text for p, text in zip(self.settings, texts, strict=True) if text is not None}
        lines += relabel(by_pair)
        lines.append("# router (SMG) metrics follow" if smg is not None else "# router metrics unavailable")
        return "\n".join(lines) + "\n" + (smg or "")

    @staticmethod
    async def _text(upstream: Upstream, path: str) -> str | None:
        try:
            reply = await upstream.get(path, timeout_s=PROBE_TIMEOUT_S)
        except httpx.HTTPError:
            return None
        return reply.text if reply.status_code == 200 else None


def relabel(texts: dict[str, str]) -> list[str]:
    """Prometheus text of several pairs as one: each sample with ``pair="<name>"``, and per sample
    name and label set the sum over pairs as ``pair="all"``. Families keep their HELP and TYPE."""
    help_type: dict[str, tuple[str, str]] = {}
    samples: dict[str, list[str]] = defaultdict(list)
    sums: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = defaultdict(dict)
    for pair, text in texts.items():
        for family in text_string_to_metric_families(text):
            name = family.name + ("_total" if family.type == "counter" else "")
            help_type.setdefault(name, (family.documentation, family.type))
            for sample in family.samples:
                labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "pair"))
                samples[name].append(_line(sample.name, (*labels, ("pair", pair)), sample.value))
                key = (sample.name, labels)
                sums[name][key] = sums[name].get(key, 0.0) + sample.value
    lines: list[str] = []
    for name, (documentation, kind) in help_type.items():
        lines += [f"# HELP {name} {documentation}", f"# TYPE {name} {_TYPES.get(kind, 'untyped')}"]
        lines += samples[name]
        lines += [_line(n, (*labels, ("pair", "all")), v) for (n, labels), v in sums[name].items()]
    return lines


_TYPES = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "summary": "summary"}


def _line(name: str, labels: tuple[tuple[str, str], ...], value: float) -> str:
    text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    return f"{name}{{{text}}} {floatToGoString(value)}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
