"""GPU tests: the exllamav3 engine for real. Skipped where CUDA or exllamav3 is missing.

They need a converted EXL3 model: ``SPARKFOLD_EXL3_MODEL`` names its directory (``make gpu-run``
converts the decisive tiny GLM-5.3-Flash fixture and sets it). ``SPARKFOLD_GPU_OUT``, when set,
collects measured numbers (``gpu_results.json``) next to the logs.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gpu_engine import VIDEO_LIMITS, Results, start_engine
from tests.integration.engine_procs import EngineProcess


def _cuda() -> bool:
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("exllamav3") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    gpu_items = [item for item in items if Path(str(item.fspath)).is_relative_to(here)]
    for item in gpu_items:
        item.add_marker(pytest.mark.gpu)
    if gpu_items and not _cuda():
        skip = pytest.mark.skip(reason="needs CUDA and exllamav3 (run through `make gpu-run` on a GPU host)")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def exl3_model() -> Path:
    value = os.environ.get("SPARKFOLD_EXL3_MODEL")
    if not value or not (Path(value) / "config.json").is_file():
        pytest.skip("SPARKFOLD_EXL3_MODEL does not name a converted EXL3 model")
    return Path(value)


@pytest.fixture(scope="session")
def results() -> Results:
    return Results()


@pytest.fixture(scope="session")
def engine_process(
    tmp_path_factory: pytest.TempPathFactory, exl3_model: Path
) -> Iterator[tuple[str, EngineProcess]]:
    """The plain engine (no drafts) as configured by default, in an engine core; KDA checkpoints
    every 2048 prompt tokens so prefixes resume; small clip limits (``VIDEO_LIMITS``)."""
    url, proc = start_engine(
        tmp_path_factory.mktemp("exl3"),
        exl3_model,
        "plain",
        media=VIDEO_LIMITS,
        prefill_checkpoint_interval=2048,
    )
    try:
        yield url, proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def engine(engine_process: tuple[str, EngineProcess]) -> str:
    """The URL of ``engine_process``."""
    return engine_process[0]


@pytest.fixture(scope="session")
def client(engine: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=engine, timeout=300) as http:
        yield http


@pytest.fixture(scope="session")
def in_process_client(tmp_path_factory: pytest.TempPathFactory, exl3_model: Path) -> Iterator[httpx.Client]:
    """The plain engine in the server's own process (``[engine] core_process = false``), started
    on first use."""
    url, proc = start_engine(
        tmp_path_factory.mktemp("exl3-in-process"),
        exl3_model,
        "in-process",
        core_process=False,
        media=VIDEO_LIMITS,
    )
    try:
        with httpx.Client(base_url=url, timeout=300) as http:
            yield http
    finally:
        proc.stop()


@pytest.fixture(params=["core", "in-process"])
def any_client(request: pytest.FixtureRequest) -> httpx.Client:
    """The engine in an engine core (the default), then in the server's process: the same test
    against both."""
    name = "client" if request.param == "core" else "in_process_client"
    return request.getfixturevalue(name)  # type: ignore[no-any-return]
