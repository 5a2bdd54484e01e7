"""Several pairs behind one endpoint: the router host's two processes.

``sparkfold router`` runs SMG (:mod:`sparkfold.fleet.router`) on loopback; ``sparkfold fleet``
runs the public front (:mod:`sparkfold.fleet.app`) that checks our keys and carries the routes SMG
does not. Both read ``/etc/sparkfold/fleet.toml`` (:mod:`sparkfold.fleet.settings`).
"""

from sparkfold.fleet.settings import DEFAULT_FLEET_PATH, FleetSettings, PairSettings, load_fleet

__all__ = ["DEFAULT_FLEET_PATH", "FleetSettings", "PairSettings", "load_fleet"]
