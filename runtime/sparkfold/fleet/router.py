"""Run SMG (the ``smg`` wheel's router) from fleet.toml, with its keys kept off the command line.

``smg launch`` takes its keys as options, which every local user can read in ``/proc/*/cmdline``.
:func:`router_argv` turns ``[router]`` into SMG's options *without* keys; :func:`launch` parses them
with SMG's own parser, adds the keys read from their files, and starts SMG in this process.

What is set and why (``docs/fleet.md`` has the whole story):

- loopback bind, ``--api-key`` (required from the front, sent to every pair), control-plane key:
  SMG's caveats (open control plane, client keys not forwarded) closed on the router host;
- ``--discovery-provider file``: the pairs taking new conversations come from a manifest SMG
  rereads when it changes, so draining or adding a pair never restarts the router;
- the policy with ``--cache-boundaries`` at the engine's checkpoint positions, so affinity is
  scored where a kept prompt state can actually resume;
- health checks every ``health_interval_s`` with the thresholds of ``[router]``; retries on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sparkfold.fleet.settings import FleetSettings, PairSettings, read_secret

__all__ = ["launch", "manifest", "router_argv"]

# The id SMG's control plane knows the front by.
CONTROL_KEY_ID = "sparkfold-fleet"


def router_argv(fleet: FleetSettings) -> list[str]:
    """``smg launch`` options for ``[router]``; holds no secret (safe to print and log)."""
    router = fleet.router
    argv = [
        "--host", router.host,
        "--port", str(router.port),
        "--prometheus-host", router.host,
        "--prometheus-port", str(router.metrics_port),
        "--discovery-provider", "file",
        "--discovery-file", str(router.workers_file),
        "--discovery-check-interval-secs", str(router.health_interval_s),
        "--policy", router.policy,
        "--cache-threshold", str(router.cache_threshold),
        "--health-check-endpoint", "/health",
        "--health-check-interval-secs", str(router.health_interval_s),
        "--health-failure-threshold", str(router.health_failure_threshold),
        "--health-success-threshold", str(router.health_success_threshold),
        "--retry-max-retries", str(router.max_retries),
        "--request-timeout-secs", str(router.request_timeout_s),
        # the pairs' gateways tokenize; SMG routes on request text and needs no tokenizer
        "--disable-tokenizer-autoload",
        # our gateways are SMG's "generic" OpenAI workers: no SGLang load reports to poll
        "--disable-worker-overload-protection",
        "--history-backend", "none",
        "--log-json",
    ]  # fmt: skip
    if router.cache_boundaries:
        argv += ["--cache-boundaries", ",".join(str(b) for b in router.cache_boundaries)]
    return argv + list(router.extra_args)


def manifest(pairs: list[PairSettings]) -> dict[str, Any]:
    """SMG's discovery manifest (version 1) for the pairs that take new conversations."""
    return {"version": 1, "workers": [{"id": pair.name, "url": pair.url} for pair in pairs]}


def write_manifest(fleet: FleetSettings, path: Path | None = None) -> Path:
    """Write the manifest of ``fleet``'s serving pairs atomically (SMG watches the file)."""
    target = path or fleet.router.workers_file
    partial = target.with_name(target.name + ".partial")
    partial.write_text(json.dumps(manifest(fleet.serving), indent=2) + "\n", encoding="utf-8")
    partial.replace(target)
    return target


def launch(fleet: FleetSettings) -> None:
    """Start SMG in this process and serve until it stops (SIGTERM: SMG drains in-flight requests)."""
    from smg.launch_router import launch_router, parse_router_args  # type: ignore[import-untyped]
    from smg.router_args import RouterArgs  # type: ignore[import-untyped]

    args = parse_router_args(router_argv(fleet))
    args.api_key = read_secret(fleet.router.key_file, "the router key file")
    control = read_secret(fleet.router.control_key_file, "the router control key file")
    args.control_plane_api_keys = RouterArgs._parse_control_plane_api_keys(
        [f"{CONTROL_KEY_ID}:sparkfold fleet front:admin:{control}"]
    )
    launch_router(args)
