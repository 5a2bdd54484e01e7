"""Tiny packages for a ``--find-links`` folder: wheels with any tags, an sdist with an in-tree
build backend (so ``pip wheel`` builds it without fetching setuptools), and a project folder pip can
build into a wheel. Standard library only; pip checks the names and metadata, never the code."""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import textwrap
import zipfile
from collections.abc import Iterable
from pathlib import Path


def _metadata(name: str, version: str, requires: Iterable[str]) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    return "\n".join([*lines, *(f"Requires-Dist: {r}" for r in requires)]) + "\n"


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def wheel_bytes(name: str, version: str, tag: str, requires: Iterable[str] = ()) -> bytes:
    """A wheel of one empty module ``name``, tagged ``tag`` ("cp312-cp312-manylinux_2_17_aarch64")."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"",
        f"{info}/METADATA": _metadata(name, version, requires).encode(),
        f"{info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: fake_wheels\n"
            f"Root-Is-Purelib: {'true' if tag.endswith('none-any') else 'false'}\n"
            + "".join(
                f"Tag: {tag.split('-')[0]}-{tag.split('-')[1]}-{p}\n" for p in tag.split("-")[2].split(".")
            )
        ).encode(),
    }
    record = [_record_line(path, data) for path, data in files.items()] + [f"{info}/RECORD,,"]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
        archive.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return buffer.getvalue()


def add_wheel(folder: Path, name: str, version: str, tag: str, requires: Iterable[str] = ()) -> Path:
    """Write ``name-version-tag.whl`` into ``folder``; returns its path."""
    path = folder / f"{name}-{version}-{tag}.whl"
    path.write_bytes(wheel_bytes(name, version, tag, requires))
    return path


# A PEP 517 backend of a few lines, shipped inside the sdist (backend-path), that builds a pure wheel.
_BACKEND = """
import pathlib, sys
sys.path.insert(0, str(pathlib.Path(__file__).parent))
from fake_wheels_backend_impl import wheel_bytes
NAME, VERSION = {name!r}, {version!r}
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    filename = f"{{NAME}}-{{VERSION}}-py3-none-any.whl"
    pathlib.Path(wheel_directory, filename).write_bytes(wheel_bytes(NAME, VERSION, "py3-none-any"))
    return filename
"""


def add_sdist(folder: Path, name: str, version: str) -> Path:
    """Write ``name-version.tar.gz`` into ``folder``: builds, with no build requirements, into a pure
    wheel (only ``pip wheel`` can turn it into a wheel; ``pip download --only-binary`` cannot)."""
    root = f"{name}-{version}"
    files = {
        "pyproject.toml": textwrap.dedent(f"""\
            [build-system]
            requires = []
            build-backend = "backend"
            backend-path = ["."]
            [project]
            name = "{name}"
            version = "{version}"
        """),
        "PKG-INFO": _metadata(name, version, ()),
        "backend.py": _BACKEND.format(name=name, version=version),
        "fake_wheels_backend_impl.py": Path(__file__).read_text(),
    }
    path = folder / f"{root}.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for relative, text in files.items():
            data = text.encode()
            member = tarfile.TarInfo(f"{root}/{relative}")
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
    return path


def write_project(
    folder: Path,
    name: str,
    requires: Iterable[str],
    extras: dict[str, list[str]],
    build_requires: Iterable[str] = ("setuptools>=69",),
) -> Path:
    """A setuptools project ``name`` 0.1 (one empty module) with these requirements, extras and build
    requirements (``[build-system] requires``)."""
    folder.mkdir(parents=True, exist_ok=True)
    extra_lines = "".join(f"{extra} = {list(reqs)!r}\n" for extra, reqs in extras.items())
    (folder / "pyproject.toml").write_text(
        textwrap.dedent(f"""\
            [build-system]
            requires = {list(build_requires)!r}
            build-backend = "setuptools.build_meta"
            [project]
            name = "{name}"
            version = "0.1"
            dependencies = {list(requires)!r}
            [project.optional-dependencies]
        """)
        + extra_lines
        + "[tool.setuptools]\npackages = ['"
        + name
        + "']\n"
    )
    (folder / name).mkdir(exist_ok=True)
    (folder / name / "__init__.py").write_text("")
    return folder
