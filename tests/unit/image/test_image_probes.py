"""What the image role's probes found, read from their results as Ansible registers them
(sparkfold.image.probes; roles/sparkfold_image/tasks/docker.yml, tag.yml, series.yml, base.yml, pull.yml)."""

from __future__ import annotations

import json

import pytest

from sparkfold.image import probes

COMMIT = "a" * 40
TAG_OBJECT = "b" * 40
SKIPPED = {"changed": False, "skipped": True, "skip_reason": "Conditional result was False"}


@pytest.mark.parametrize("result", [None, {}, SKIPPED])
def test_a_probe_that_did_not_run_found_nothing(result: dict[str, object] | None) -> None:
    assert not probes.ran(result)
    assert (probes.text(result), probes.tag_commit(result), probes.pulled_digest(result)) == ("", "", "")
    assert probes.fetched_files(result) == [] and probes.json_field(result, "value", "") == ""
    assert not probes.docker_answers(result)


def test_docker_answers_only_with_exit_status_0() -> None:
    assert probes.docker_answers({"rc": 0, "stdout": "28.1.1"})
    assert not probes.docker_answers({"rc": 1, "stderr": "Cannot connect to the Docker daemon"})


@pytest.mark.parametrize(
    ("result", "said"),
    [
        ({"rc": 2, "stderr": "", "msg": "[Errno 2] No such file or directory: b'docker'"}, "not installed"),
        ({"rc": 127, "stderr": ""}, "not installed"),
        ({"rc": 1, "stderr": "Cannot connect to the Docker daemon\n"}, "Cannot connect to the Docker daemon"),
        ({"rc": 2, "stderr": "permission denied"}, "permission denied"),
        ({"rc": 1, "stderr": "", "msg": " non-zero return code "}, "non-zero return code"),
    ],
)
def test_why_docker_does_not_answer(result: dict[str, object], said: str) -> None:
    found = probes.docker_problem(result)
    assert found == ("docker is not installed (not on PATH)" if said == "not installed" else said)


def test_an_annotated_tags_commit_wins_over_the_tag_object() -> None:
    lines = [f"{TAG_OBJECT}\trefs/tags/v0.6.0", f"{COMMIT}\trefs/tags/v0.6.0^{{}}"]
    assert probes.tag_commit({"rc": 0, "stdout_lines": lines}) == COMMIT
    assert probes.tag_commit({"rc": 0, "stdout_lines": lines[:1]}) == TAG_OBJECT
    assert probes.tag_commit({"rc": 0, "stdout_lines": []}) == ""


@pytest.mark.parametrize(
    ("result", "said"),
    [
        ({"rc": 2, "stderr": "", "msg": "[Errno 2] No such file"}, "git is not installed (not on PATH)"),
        (
            {"rc": 128, "stderr": "x", "stderr_lines": ["fatal: unable to access", "", "fatal: no route"]},
            "fatal: no route",
        ),
        ({"rc": 0, "stderr": "", "stderr_lines": [], "stdout_lines": []}, "no such tag"),
        ({"rc": 1, "stderr": "", "stderr_lines": [], "msg": "non-zero return code"}, "non-zero return code"),
    ],
)
def test_why_the_tag_did_not_resolve(result: dict[str, object], said: str) -> None:
    assert probes.tag_problem(result) == said


def test_the_pulled_base_digest_is_what_follows_the_at() -> None:
    digest = "sha256:" + "1" * 64
    assert probes.pulled_digest({"rc": 0, "stdout": f"nvcr.io/nvidia/pytorch@{digest}\n"}) == digest
    assert probes.pulled_digest({"rc": 0, "stdout": "nvcr.io/nvidia/pytorch:26.07-py3"}) == ""


def test_the_fetched_series_is_its_files_in_order_and_a_refusal_its_words() -> None:
    files = [{"name": "0002-b.patch", "sha256": "2" * 64}, {"name": "0001-a.patch", "sha256": "1" * 64}]
    done = {"rc": 0, "stdout": json.dumps({"ok": True, "files": files, "unpinned": []}), "stderr": ""}
    assert probes.fetched_files(done) == files
    refused = {"rc": 1, "stdout": "", "stderr": "Error: 0001-a.patch of x: sha256 y, not the pinned z\n"}
    assert probes.fetched_files(refused) == []
    assert probes.fetch_problem(refused) == "0001-a.patch of x: sha256 y, not the pinned z"
    assert probes.fetch_problem({"rc": 2, "msg": "[Errno 2] No such file"}) == "[Errno 2] No such file"


def test_a_json_field_of_output_that_is_not_json_is_the_default() -> None:
    assert probes.json_field({"rc": 0, "stdout": '{"value": "a1897d591f70"}'}, "value", "") == "a1897d591f70"
    assert probes.json_field({"rc": 0, "stdout": "not json"}, "value", "") == ""
    assert probes.json_field({"rc": 0, "stdout": "[1]"}, "value", "") == ""
