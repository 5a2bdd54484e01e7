"""The compile caches in the node's state directory (``sparkfold.engines.compile_cache``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from sparkfold.engines.compile_cache import CACHES, use_compile_caches
from sparkfold.node.marker import describe_start, start_phases


def test_each_cache_points_into_the_state_directory_and_a_second_start_is_a_restart(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    assert use_compile_caches(tmp_path, env) == "first"
    assert env == {name: str(tmp_path / "compile-cache" / folder) for name, folder in CACHES.items()}
    assert all(Path(folder).is_dir() for folder in env.values())  # exllamav3 reads a missing path as a file
    (Path(env["TRITON_CACHE_DIR"]) / "kernel.cubin").write_bytes(b"x")
    assert use_compile_caches(tmp_path, env) == "restart"


def test_a_cache_the_environment_names_is_kept(tmp_path: Path) -> None:
    env = {"TRITON_CACHE_DIR": str(tmp_path / "mine")}
    use_compile_caches(tmp_path / "state", env)
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "mine") and (tmp_path / "mine").is_dir()


def test_a_folder_that_cannot_be_made_leaves_that_cache_alone(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    env: dict[str, str] = {}
    assert use_compile_caches(blocker, env) == "first"
    assert env == {}


def test_the_start_line_names_the_phases() -> None:
    engine = SimpleNamespace(start_phases={"load_s": 17.3, "warmup_s": 0.8})
    phases = start_phases(engine, 0.284)
    assert phases == {"load_s": 17.3, "warmup_s": 0.8, "first_token_s": 0.28}
    line = describe_start("restart", phases, 32.51)
    assert line == "ready in 32.51 s (restart start): load 17.3 s, warm-up 0.8 s, first token 0.28 s"
    assert describe_start("first", {"first_token_s": 1.7}, None) == "ready (first start): first token 1.7 s"
