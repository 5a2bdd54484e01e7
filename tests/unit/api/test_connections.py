"""How the gateway counts connections per client, and the per-client cap's rule."""

from __future__ import annotations

import pytest

from sparkfold.api.connections import ConnectionLimits, client_of
from sparkfold.config import ApiSettings


@pytest.mark.parametrize(
    ("peer", "key"),
    [
        (("127.0.0.2", 5000), "127.0.0.2"),
        (("2001:db8:1:2:aaaa::1", 5000, 0, 0), "2001:db8:1:2::/64"),  # one host's block, not its address
        (("2001:db8:1:2:bbbb::9", 5001, 0, 0), "2001:db8:1:2::/64"),
        (("::ffff:198.51.100.7", 5000, 0, 0), "198.51.100.7"),  # dual-stack socket, IPv4 client
        (None, ""),  # a Unix socket
    ],
)
def test_a_client_is_its_address_or_its_ipv6_64(peer: object, key: str) -> None:
    assert client_of(peer) == key


@pytest.mark.parametrize(
    ("total", "per_client", "expected"),
    [
        (2048, 512, (2048, 512)),
        (20, 19, (20, 15)),  # a quarter always left to the other clients
        (1, 1, (1, 1)),  # (not below max_connections: no per-client cap)
        (100, 100, (100, 100)),  # equal: no per-client cap (behind a reverse proxy)
    ],
)
def test_the_per_client_cap_leaves_a_reserve(total: int, per_client: int, expected: tuple[int, int]) -> None:
    limits = ConnectionLimits.of(ApiSettings(max_connections=total, max_connections_per_client=per_client))
    assert (limits.max_connections, limits.max_connections_per_client) == expected
