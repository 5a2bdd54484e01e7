"""How fast the weights store hashes, against plain in-memory sha256 measured in the same run.

    PYTHONPATH=runtime python tests/bench/weights_hash.py [--mib-per-file 256] [--files 4]

Writes the files under a temporary directory (read once so the page cache is warm), then times:
in-memory ``hashlib.sha256`` over one file's bytes (the baseline), ``build_manifest`` with 1 and 2
jobs, and ``verify_dir`` with ``sizes_only``. Prints one JSON object; ratios are MiB/s over the baseline.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from sparkfold.weights import build_manifest, verify_dir


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib-per-file", type=int, default=256)
    parser.add_argument("--files", type=int, default=4)
    args = parser.parse_args()
    mib = args.mib_per_file * args.files
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "model"
        root.mkdir()
        for i in range(args.files):
            (root / f"shard{i}.safetensors").write_bytes(os.urandom(args.mib_per_file << 20))
        data = (root / "shard0.safetensors").read_bytes()
        for path in root.iterdir():
            path.read_bytes()

        start = time.perf_counter()
        hashlib.sha256(data).hexdigest()
        baseline = args.mib_per_file / (time.perf_counter() - start)
        results: dict[str, float] = {"baseline_sha256_in_memory_mib_s": round(baseline, 1)}
        for jobs in (1, 2):
            start = time.perf_counter()
            manifest = build_manifest(root, jobs=jobs, interval_s=3600)
            rate = mib / (time.perf_counter() - start)
            results[f"manifest_jobs{jobs}_mib_s"] = round(rate, 1)
            results[f"manifest_jobs{jobs}_ratio"] = round(rate / baseline, 2)
        start = time.perf_counter()
        assert verify_dir(root, manifest, sizes_only=True).ok
        results["verify_sizes_only_s"] = round(time.perf_counter() - start, 4)
    results["load_average_1m"] = os.getloadavg()[0]
    print(json.dumps({"files": args.files, "mib": mib, **results}, indent=2))


if __name__ == "__main__":
    main()
