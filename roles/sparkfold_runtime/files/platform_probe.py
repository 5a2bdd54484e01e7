"""Print, as one JSON line, what a binary wheel must be built for to install under this Python.

    {"platform": "linux-aarch64", "python": "3.12", "abi": "cp312",
     "tags": ["manylinux_2_39_aarch64", ..., "manylinux_2_17_aarch64", "manylinux2014_aarch64",
              "linux_aarch64"]}

The runtime role runs it with the control host's Python and with each node's python3, and builds the
node wheelhouse for the nodes' ``tags`` when the two differ (``pip download --platform``).

Why the tags are derived here, from the C library and the CPU, rather than read from ``packaging.tags``
or ``pip debug --verbose``: a node's system python3 has neither pip nor packaging before the runtime's
venv exists (DGX OS and Debian ship them as separate packages), and pip calls its ``debug`` output
unstable. PEP 600 defines the manylinux tags a system accepts from exactly these two facts: every
``manylinux_2_Y_<arch>`` from its glibc 2.X down to the oldest of that architecture, plus the older
names that alias some of them (PEP 513, 571, 599). ``tests/ansible`` checks the result against
``packaging.tags`` on the test host. Standard library only; runs on any CPython 3.8+.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig

# The oldest glibc minor each architecture has manylinux wheels for (PEP 600; as packaging has it).
OLDEST_GLIBC_MINOR = {"x86_64": 5, "i686": 5}
OLDEST_GLIBC_MINOR_ELSEWHERE = 17
# Older tag names that stand for a glibc 2.Y (manylinux2014 = 2.17, manylinux2010 = 2.12, manylinux1 = 2.5).
LEGACY_NAMES = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


def manylinux_tags(arch: str, glibc: str) -> list[str]:
    """The platform tags a glibc ``glibc`` ("2.39") system on ``arch`` accepts, most specific first."""
    major, minor = (int(part) for part in glibc.split(".")[:2])
    if major != 2:
        return ["linux_" + arch]
    tags = []
    for y in range(minor, OLDEST_GLIBC_MINOR.get(arch, OLDEST_GLIBC_MINOR_ELSEWHERE) - 1, -1):
        tags.append(f"manylinux_2_{y}_{arch}")
        if y in LEGACY_NAMES:
            tags.append(f"{LEGACY_NAMES[y]}_{arch}")
    return [*tags, "linux_" + arch]


def glibc_version() -> str | None:
    """This process's glibc version ("2.39"), or None where the C library is not glibc (musl, macOS)."""
    try:
        found = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.39"
    except (AttributeError, ValueError, OSError):
        return None
    if not found or not found.startswith("glibc "):
        return None
    return found.split()[1]


def describe() -> dict[str, object]:
    platform = sysconfig.get_platform()  # "linux-aarch64", "macosx-14.0-arm64"
    glibc = glibc_version() if platform.startswith("linux-") else None
    # A 32-bit Python on a 64-bit kernel reports the kernel's machine; packaging corrects it the same way.
    arch = platform.split("-", 1)[-1].replace("-", "_").replace(".", "_")
    if arch == "x86_64" and sys.maxsize <= 2**32:
        arch = "i686"
    abi = "cp{}{}".format(*sys.version_info[:2])
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        abi += "t"
    return {
        "platform": platform,
        "python": "{}.{}".format(*sys.version_info[:2]),
        "abi": abi,
        "tags": manylinux_tags(arch, glibc) if glibc else [],
    }


if __name__ == "__main__":
    print(json.dumps(describe(), sort_keys=True))
