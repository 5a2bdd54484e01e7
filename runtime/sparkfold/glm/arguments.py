"""Tool-call arguments typed by the offered JSON schema: the one home of that rule.

Two inputs, one schema reading (``type``, type lists, ``anyOf`` / ``oneOf`` / ``allOf``, ``enum``,
``const``):

- **GLM's raw text** (:func:`coerce_arguments`, our engines' parser; reference ``glm.md`` 7.2):
  GLM writes every value as untyped text, so each takes its best fit, as vLLM's GLM tool parser
  does: a value is kept as the raw string when the schema allows a string and the text is not a
  better fit for another allowed type; otherwise it is parsed as JSON (numbers, booleans, null,
  arrays, objects). A key the schema does not know is parsed as JSON when it is valid JSON.
- **Any engine's JSON** (:func:`repair_arguments`, the gateway's tool-call hygiene): the values
  already have types, and one that fits its schema is the model's choice and is kept as it is,
  a union included (``"7"`` for ``integer | string`` stays ``"7"``), an unknown key too. Only a
  value that fits no allowed type is repaired, where one repair makes it fit: JSON text holding
  the right type is parsed (``"3"`` for an integer), an integral float becomes an integer, a
  number for a string-only property becomes its text; nested properties and items likewise.

What OpenAI clients expect either way: arguments that validate against the schema they offered
(the SDKs' ``parse`` helpers, pydantic-ai and instructor validate them), never a valid value
rewritten into another valid one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["coerce_arguments", "coerce_value", "repair_arguments", "repair_value", "streams_raw"]

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


def _bounded(schema: Mapping[str, Any]) -> bool:
    return "maxLength" in schema or "minLength" in schema


def streams_raw(schema: Any) -> bool:
    """Whether :func:`coerce_value` keeps any text of this property as it is (a plain string), so
    the value can be written out while it is generated."""
    return (
        isinstance(schema, Mapping)
        and "enum" not in schema
        and not _bounded(schema)
        and _allowed_types(schema) == {"string"}
    )


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
        return text.strip() if _bounded(schema) else text  # a grammar lets whitespace surround a bounded one
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


def _fits(value: Any, types: set[str]) -> bool:
    return any(_is_type(value, _JSON_TYPES[t]) for t in types if t in _JSON_TYPES)


def _inside(value: Any, schema: Mapping[str, Any]) -> Any:
    """``value``'s properties or items repaired by the schema's ``properties`` or ``items``."""
    properties, items = schema.get("properties"), schema.get("items")
    if isinstance(value, dict) and isinstance(properties, Mapping):
        return {key: repair_value(item, properties.get(key)) for key, item in value.items()}
    if isinstance(value, list) and isinstance(items, Mapping):
        return [repair_value(item, items) for item in value]
    return value


def _integral(number: Any, types: set[str], otherwise: Any) -> Any:
    """An integral float as the integer a schema wants, else ``otherwise``."""
    if isinstance(number, float) and "integer" in types and number.is_integer():
        return int(number)
    return otherwise


def repair_value(value: Any, schema: Any) -> Any:
    """One JSON value fitted to its property ``schema``: kept when it fits, repaired when it
    does not and one repair makes it fit, else left as it is."""
    if not isinstance(schema, Mapping):
        return value
    types = _allowed_types(schema)
    if not types or _fits(value, types):
        return _inside(value, schema)
    if isinstance(value, str):
        ok, parsed = _parse(value)
        if not ok or (isinstance(parsed, float) and not math.isfinite(parsed)):
            return value
        if _fits(parsed, types):
            return _inside(parsed, schema)
        return _integral(parsed, types, value)  # "3.0" for an integer
    value = _integral(value, types, value)
    if _fits(value, types):
        return value
    if "string" in types and isinstance(value, int | float) and not isinstance(value, bool):
        return json.dumps(value)
    return value


def repair_arguments(arguments: Mapping[str, Any], parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    """A call's JSON arguments fitted to the tool's ``parameters`` schema (see the module)."""
    if not isinstance(parameters, Mapping):
        return dict(arguments)
    return dict(repair_value(dict(arguments), {**parameters, "type": "object"}))
