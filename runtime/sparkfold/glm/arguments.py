"""Tool-call argument values typed by the offered JSON schema (reference ``glm.md`` 7.2).

GLM writes every argument value as untyped text. A value is kept as the raw string when the
schema allows a string and the text is not a better fit for another allowed type; otherwise it
is parsed as JSON (numbers, booleans, null, arrays, objects). ``anyOf`` / ``oneOf`` / type lists
and ``enum`` are honoured; a key the schema does not know is parsed as JSON when it is valid JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["coerce_arguments", "coerce_value"]

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
    "array": (list,),
    "object": (dict,),
}
_PY_LITERALS = {"True": True, "False": False, "None": None}


def _allowed_types(schema: Mapping[str, Any]) -> set[str]:
    """Every JSON type a schema admits; empty = anything."""
    types: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        types.add(declared)
    elif isinstance(declared, list):
        types.update(t for t in declared if isinstance(t, str))
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key) or []:
            if isinstance(sub, Mapping):
                sub_types = _allowed_types(sub)
                if not sub_types:
                    return set()
                types |= sub_types
    if "enum" in schema and not types:
        for option in schema["enum"]:
            types |= {name for name, py in _JSON_TYPES.items() if _is_type(option, py)}
    if "const" in schema and not types:
        types |= {name for name, py in _JSON_TYPES.items() if _is_type(schema["const"], py)}
    if not types and ("properties" in schema):
        types.add("object")
    if not types and ("items" in schema):
        types.add("array")
    return types


def _is_type(value: Any, py: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in py:
        return False
    return isinstance(value, py)


def _parse(text: str) -> tuple[bool, Any]:
    stripped = text.strip()
    if stripped in _PY_LITERALS:
        return True, _PY_LITERALS[stripped]
    try:
        return True, json.loads(stripped)
    except (json.JSONDecodeError, ValueError):
        return False, None


def coerce_value(text: str, schema: Mapping[str, Any] | None) -> Any:
    """One argument value: raw ``text`` typed by its property ``schema``."""
    if not isinstance(schema, Mapping):
        ok, value = _parse(text)
        return value if ok and not isinstance(value, str) else text
    if "enum" in schema and text in schema["enum"]:
        return text
    if "enum" in schema and text.strip() in schema["enum"]:  # a grammar lets whitespace surround it
        return text.strip()
    types = _allowed_types(schema)
    if types == {"string"}:
        bounded = "maxLength" in schema or "minLength" in schema
        return text.strip() if bounded else text  # a grammar lets whitespace surround a bounded one
    ok, value = _parse(text)
    if not ok:
        return text
    if not types:
        return value if not isinstance(value, str) else text
    if any(_is_type(value, _JSON_TYPES[t]) for t in types if t in _JSON_TYPES):
        return value
    if "integer" in types and isinstance(value, float) and value.is_integer():
        return int(value)
    return text if "string" in types else value


def coerce_arguments(raw: Mapping[str, str], parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    """Every raw argument typed by the tool's ``parameters`` schema."""
    properties = (parameters or {}).get("properties") if isinstance(parameters, Mapping) else None
    properties = properties if isinstance(properties, Mapping) else {}
    return {key: coerce_value(text, properties.get(key)) for key, text in raw.items()}
