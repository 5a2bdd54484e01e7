"""sparkfold.config: every bad file names its key; the fingerprint is stable and engine-only."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkfold.config import ConfigError, engine_differences, engine_fingerprint, load, parse

MINIMAL = {"engine": {"model": "/models/demo"}}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sparkfold.toml"
    path.write_text(text)
    return path


def test_example_local_is_valid(repo: Path) -> None:
    settings = load(repo / "examples/local.toml")
    assert settings.engine.kind == "transformers"
    assert (settings.engine.host, settings.engine.port) == ("127.0.0.1", 18888)
    assert settings.engine_url == "http://127.0.0.1:18888"
    assert not settings.api.keys_required  # loopback


def test_defaults_follow_design() -> None:
    settings = parse(MINIMAL)
    assert settings.fabric.rendezvous_port == 29551
    assert settings.engine.context == 1_048_576
    assert settings.api.port == 8888 and settings.api.parallel == 4 and settings.api.max_queued == 16
    assert settings.api.keys_required  # 0.0.0.0 by default


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[engine]\nmodel = "m"\ntp = 3\n', "engine.tp: Input should be less than or equal to 2"),
        ('[engine]\nmodel = "m"\nkindd = "x"\n', "engine.kindd: unknown key"),
        ('[engine]\nmodel = "m"\nkind = "vllm"\n', "engine.kind: Input should be 'transformers'"),
        ("[node]\nrank = 0\n", "engine: required key is missing"),
        (
            '[engine]\nmodel = "m"\n[fabric]\naddress = "not-an-ip"\n',
            "fabric.address: Input is not a valid IPv4",
        ),
        ('[engine]\nmodel = "m"\ntp = 2\n', "fabric.address is required when engine.tp > 1"),
        ('[engine]\nmodel = "m"\n[node]\nrank = 1\n', "node.rank (1) must be below engine.tp (1)"),
        (
            '[engine]\nmodel = "m"\ncontext = 100\nmax_tokens = 200\n',
            "engine.max_tokens (200) must not exceed",
        ),
        (
            '[engine]\nmodel = "m"\n[api]\nport = 70000\n',
            "api.port: Input should be less than or equal to 65535",
        ),
        ('[engine\nmodel = "m"\n', "not valid TOML"),
    ],
)
def test_bad_files_name_the_key(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load(path)
    assert expected in str(caught.value)
    assert str(caught.value).startswith(str(path))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "absent.toml")


def test_fingerprint_ignores_everything_but_the_engine() -> None:
    head = parse({**MINIMAL, "node": {"rank": 0, "name": "head"}, "api": {"port": 9000}})
    worker = parse({**MINIMAL, "node": {"rank": 0, "name": "worker"}, "paths": {"state_dir": "/x"}})
    assert engine_fingerprint(head) == engine_fingerprint(worker)
    assert len(engine_fingerprint(head)) == 64


def test_fingerprint_is_stable_across_key_order() -> None:
    a = parse({"engine": {"model": "m", "context": 4096, "max_tokens": 64}})
    b = parse({"engine": {"max_tokens": 64, "context": 4096, "model": "m"}})
    assert engine_fingerprint(a) == engine_fingerprint(b)
    # pinned: changing the schema's engine section changes every deployed fingerprint, so it is deliberate
    assert engine_fingerprint(a) == engine_fingerprint(a.engine)


def test_fingerprint_follows_engine_fields() -> None:
    a = parse({"engine": {"model": "m"}})
    b = parse({"engine": {"model": "m", "transformers": {"dtype": "bfloat16"}}})
    assert engine_fingerprint(a) != engine_fingerprint(b)
    names = engine_differences(a.engine.model_dump(mode="json"), b.engine.model_dump(mode="json"))
    assert names == ["engine.transformers.dtype"]


def test_gateway_lanes_and_queue_follow_the_engine_unless_given() -> None:
    follows = parse({"engine": {"model": "m", "parallel": 2}})
    assert (follows.api.parallel, follows.api.max_queued) == (2, 8)
    given = parse({"engine": {"model": "m", "parallel": 2}, "api": {"parallel": 1, "max_queued": 3}})
    assert (given.api.parallel, given.api.max_queued) == (1, 3)
    default = parse({"engine": {"model": "m"}})
    assert (default.api.parallel, default.api.max_queued) == (4, 16)


@pytest.mark.parametrize(
    ("engine", "core"),
    [
        ({"kind": "exllamav3"}, True),
        ({"kind": "exllamav3", "tp": 2}, False),
        ({"kind": "exllamav3", "core_process": False}, False),
        ({"kind": "transformers"}, False),
        ({"kind": "transformers", "core_process": True}, True),
        ({"kind": "tensorfold"}, False),
    ],
)
def test_the_engine_core_is_on_by_default_for_exllamav3_on_one_gpu(
    engine: dict[str, object], core: bool
) -> None:
    assert parse({"engine": {"model": "m", **engine}}).engine.core_process is core


def test_one_stall_knob_for_every_engine_kind(tmp_path: Path) -> None:
    ours = parse({"engine": {"model": "m"}})
    tensorfold = parse({"engine": {"model": "m", "kind": "tensorfold"}})
    given = parse({"engine": {"model": "m", "kind": "tensorfold", "stall_s": 60}})
    assert (ours.engine.stall_s, tensorfold.engine.stall_s, given.engine.stall_s) == (300, 900, 60)
    old = write(tmp_path, '[engine]\nmodel = "m"\nkind = "tensorfold"\n[engine.tensorfold]\nstall_s = 60\n')
    with pytest.raises(ConfigError) as caught:
        load(old)
    assert "engine.tensorfold: stall_s moved to [engine] stall_s" in str(caught.value)
