"""What a run wrote: listings of the nodes' and the control host's files, taken before and after it.

A listing maps each path to its size and mtime. On a node it covers the root filesystem outside the
folders a running system writes by itself; on the control host, ``.cache/control`` (wheelhouse,
manifests, credentials, the curl line) and the build folders setuptools would leave in the checkout.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed_kit import ADMIN, REPO, Run, ssh

# Written by the running system itself (kernel, journald, systemd's state, sockets, scratch files).
SYSTEM_WRITES = ["/proc", "/sys", "/run", "/tmp", "/var/log", "/var/lib/systemd"]
# Ansible's own working folder (remote_tmp, ~/.ansible/tmp of the login): the first Ansible run of
# any kind makes it, stages module files in it and removes them. Not sparkfold's doing: the login's
# home is listed without it (and without the mtime its creation gives the home folder).
HOME = f"/home/{ADMIN}"
CONTROL = [REPO / ".cache/control", REPO / "build", REPO / "runtime/sparkfold.egg-info"]
Listing = dict[str, str]  # path -> "size mtime"


def node_listing(address: str) -> Listing:
    """Every path on the node's root filesystem (outside SYSTEM_WRITES) with its size and mtime."""
    prune = " -o ".join(f"-path {path}" for path in SYSTEM_WRITES)
    text = ssh(address, f"find / -xdev \\( {prune} \\) -prune -o -printf '%p\\t%s %T@\\n'")
    found = dict(line.split("\t", 1) for line in text.splitlines())
    assert len(found) > 1000, f"the listing of {address} looks truncated: {len(found)} paths"
    found = {path: info for path, info in found.items() if not path.startswith(f"{HOME}/.ansible")}
    found[HOME] = found[HOME].split()[0]  # its size only
    return found


def control_listing() -> Listing:
    found = {}
    for top in CONTROL:
        for path in [top, *top.rglob("*")] if top.exists() else []:
            info = path.lstat()
            found[str(path)] = f"{info.st_size} {info.st_mtime_ns}"
    return found


def moved(before: Listing, after: Listing) -> list[str]:
    """What differs between two listings, one line per path."""
    return sorted(
        f"{path}: {before.get(path, 'absent')} -> {after.get(path, 'absent')}"
        for path in before.keys() | after.keys()
        if before.get(path) != after.get(path)
    )


@dataclass
class Checked:
    """A check run and the listings (per node name, and ``control``) taken before and after it.

    ``stale`` says why the pair was not fresh (converged before, as a kept testbed is): the run is
    then no check of a first run, and ``run`` is None."""

    run: Run | None
    before: dict[str, Listing]
    after: dict[str, Listing]
    stale: str = ""
