"""Provisioning benchmark: wall time of a fresh converge of the testbed pair vs a no-op re-run.

    sudo .venv/bin/python tests/bench/provisioning.py [--keep]

Tears the testbed down (machines only; the cached rootfs and wheelhouse stay), builds it again,
then times ``site.yml`` twice in one run. Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
# Until the engine and the gateway are in this checkout, the service and verify stages cannot run.
SITE = ("site.yml",)


def timed(*args: str) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(
        [str(PLAYBOOK), *args], cwd=REPO, capture_output=True, text=True, check=False, timeout=3600
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"ansible-playbook {' '.join(args)} failed:\n{done.stdout[-4000:]}")
    recap = [line for line in done.stdout.splitlines() if "changed=" in line and "ok=" in line]
    return wall, "; ".join(" ".join(line.split()[:5]) for line in recap)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the pair up afterwards")
    args = parser.parse_args()
    timed("playbooks/teardown.yml")
    testbed, _ = timed("playbooks/testbed.yml")
    fresh, fresh_recap = timed(*SITE)
    noop, noop_recap = timed(*SITE)
    if not args.keep:
        timed("playbooks/teardown.yml")
    rows = [
        ("testbed up (cached rootfs)", testbed, ""),
        (f"{' '.join(SITE)}, fresh pair", fresh, fresh_recap),
        (f"{' '.join(SITE)}, no-op re-run", noop, noop_recap),
    ]
    print("| run | wall s | recap |\n| --- | ---: | --- |")
    for name, wall, recap in rows:
        print(f"| {name} | {wall:.1f} | {recap} |")
    print(f"\nno-op / fresh = {noop / fresh:.2f}")
    print(json.dumps({"testbed_s": testbed, "fresh_s": fresh, "noop_s": noop}))


if __name__ == "__main__":
    main()
