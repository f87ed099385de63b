"""A JSON schema's text read for the checks: its nesting bounded before it is parsed, its
numbers finite, and every subschema in it found (schema_checks, schema_rewrite).

Nested deeper than MAX_SCHEMA_DEPTH, or holding a number no double can hold (1e400, NaN), a
schema is refused with that said: deeper nesting made every check give up silently, and
xgrammar's own parser answered 1e400 with an empty error."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

# Objects and arrays nested in one schema text, at most: real schemas stay far below (each
# level of properties is two), and the checks here (and xgrammar's parser) recurse per level.
MAX_SCHEMA_DEPTH = 64

# Keywords whose value maps names to subschemas, and those whose value is a subschema or a
# list of them. Anything else is data (a property named "allOf" is not the keyword).
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMAS = ("items", "prefixItems", "additionalProperties", "anyOf", "oneOf", "allOf",
               "contains", "propertyNames", "if", "then", "else", "unevaluatedProperties",
               "unevaluatedItems", "additionalItems", "not")
_JSON_NESTING = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


class SchemaRefused(Exception):
    """The schema's text is refused before any check (the request's error)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def nesting_depth(text: str) -> int:
    """How deeply arrays and objects nest in JSON `text` (strings skipped), without parsing
    it: json.loads itself fails past about 1,000 levels."""
    depth = deepest = 0
    for match in _JSON_NESTING.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise SchemaRefused(f"the number {text} is out of range: a schema's numbers must be "
                            "finite doubles (at most about 1.8e308)")
    return value


def _no_constant(name: str) -> Any:
    raise SchemaRefused(f"{name} is not a JSON number: a schema's numbers must be finite")


def load_schema(text: str) -> Any:
    """The schema; SchemaRefused when it nests too deeply or holds a number out of range,
    ValueError when it is not JSON (xgrammar's message then says where)."""
    depth = nesting_depth(text)
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaRefused(f"nested {depth} levels deep (arrays and objects); the server "
                            f"checks schemas up to {MAX_SCHEMA_DEPTH} levels")
    return json.loads(text, parse_float=_finite, parse_constant=_no_constant)


def walk(schema: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every subschema of `schema` that is an object, with its JSON pointer."""
    if not isinstance(schema, dict):
        return
    yield path, schema
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                yield from walk(sub, f"{path}/{key}/{name}")
    for key in _SUBSCHEMAS:
        value = schema.get(key)
        if isinstance(value, list):
            for i, sub in enumerate(value):
                yield from walk(sub, f"{path}/{key}/{i}")
        else:
            yield from walk(value, f"{path}/{key}")
