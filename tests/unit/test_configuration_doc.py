"""docs/configuration.md documents every key of the schema (a new knob without docs fails here)."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from sparkfold.config import Settings


def sections(model: type[BaseModel], prefix: str) -> dict[str, list[str]]:
    """``{"engine.transformers": ["gguf_file", ...], ...}`` for every (nested) section."""
    found: dict[str, list[str]] = {prefix: []} if prefix else {}
    for name, field in model.model_fields.items():
        kind = field.annotation
        dotted = f"{prefix}.{name}" if prefix else name
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            found |= sections(kind, dotted)
        else:
            found[prefix].append(name)
    return found


def test_every_key_is_documented_in_its_section(repo: Path) -> None:
    text = (repo / "docs/configuration.md").read_text()
    headings = re.split(r"^#{2,3} `\[([a-z0-9_.]+)\]`.*$", text, flags=re.M)
    documented = {headings[i]: headings[i + 1] for i in range(1, len(headings), 2)}
    missing = [
        f"[{section}] {key}"
        for section, keys in sections(Settings, "").items()
        for key in keys
        if f"| `{key}` |" not in documented.get(section, "")
    ]
    assert not missing, f"undocumented in docs/configuration.md: {missing}"


def test_every_fleet_key_is_documented_in_docs_fleet(repo: Path) -> None:
    from sparkfold.fleet.settings import FrontSettings, PairSettings, RouterSettings

    text = (repo / "docs/fleet.md").read_text()
    headings = re.split(r"^### `\[+([a-z_]+)\]+`.*$", text, flags=re.M)
    documented = {headings[i]: headings[i + 1] for i in range(1, len(headings), 2)}
    found = {"front": FrontSettings, "router": RouterSettings, "pairs": PairSettings}
    missing = [
        f"[{section}] {key}"
        for section, model in found.items()
        for key in model.model_fields
        if f"| `{key}` |" not in documented.get(section, "")
    ]
    assert not missing, f"undocumented in docs/fleet.md: {missing}"
