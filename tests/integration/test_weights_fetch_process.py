"""``sparkfold weights fetch`` as a real process: killed mid-file, run again, it completes.

The endpoint reaches huggingface_hub the way it does on a node (``HF_ENDPOINT`` in the environment
of a fresh process); the fake Hub listens on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fakes"))
from fake_hub import FakeHub, FakeRepo

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
COMMIT = "fedcba9876543210fedcba9876543210fedcba98"
TOKEN = "hf_process_SECRET_value_42"
rng = random.Random(11)
FILES = {
    "a.safetensors": rng.randbytes(400_000),
    "b.safetensors": rng.randbytes(400_000),
    "config.json": b"{}",
}


def _command(dest: Path, token_file: Path) -> list[str]:
    cli = "from sparkfold.cli import main; main()"
    args = ["weights", "fetch", "--repo", "acme/m", "--revision", COMMIT, "--dest", str(dest)]
    return [sys.executable, "-c", cli, *args, "--token-file", str(token_file), "--json"]


def test_a_killed_fetch_keeps_finished_files_and_the_next_run_completes(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    dest = tmp_path / "store" / "m"
    with FakeHub(FakeRepo("acme/m", FILES, commit=COMMIT, token=TOKEN)) as hub:
        env = dict(
            os.environ, HF_HOME=str(tmp_path / "hf-home"), HF_ENDPOINT=hub.url, PYTHONPATH=str(RUNTIME)
        )
        env.pop("HF_HUB_OFFLINE", None)
        hub.stall_once["b.safetensors"] = 100_000
        first = subprocess.Popen(
            _command(dest, token_file), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            assert hub.stalled.wait(60), "the fetch never reached the second file"
        finally:
            first.kill()
            first.communicate(timeout=30)
            hub.release.set()
        assert (dest / "a.safetensors").read_bytes() == FILES["a.safetensors"]
        assert not (dest / "b.safetensors").exists()
        assert list((dest / ".cache/huggingface/download").rglob("*.incomplete"))  # the killed run's

        again = subprocess.run(
            _command(dest, token_file), env=env, capture_output=True, text=True, timeout=120
        )

    assert again.returncode == 0, again.stderr
    answer = json.loads(again.stdout)
    assert answer["downloaded"] == ["b.safetensors", "config.json"]
    assert len(hub.downloads("a.safetensors")) == 1  # finished before the kill, never fetched again
    assert not list((dest / ".cache/huggingface/download").rglob("*.incomplete"))
    for rel, data in FILES.items():
        assert (dest / rel).read_bytes() == data
    assert "download: " in again.stderr and "verify: " in again.stderr
    assert TOKEN not in again.stdout + again.stderr
