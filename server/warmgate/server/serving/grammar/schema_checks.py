"""JSON-schema keywords xgrammar accepts but does not enforce, refused before compiling.

xgrammar 0.2 turns `allOf` with several subschemas and `not` into "any JSON value" (it logs
"Support for allOf with multiple options is still ongoing" and goes on): the output then
satisfies nothing the request asked for, and `allOf: [{"type": "string"}, {"type":
"integer"}]`, which no value satisfies, finished "valid" with `1000000...`. A finish the
schema does not hold for is worse than a refusal, so those keywords are INVALID_ARGUMENT
naming where they are; conflicting types under one allOf say that no value satisfies them.
(Contradictory bounds, such as minLength > maxLength or an empty enum, xgrammar refuses
itself.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

# Keywords whose value maps names to subschemas, and those whose value is a subschema or a
# list of them. Anything else is data (a property named "allOf" is not the keyword).
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMAS = ("items", "prefixItems", "additionalProperties", "anyOf", "oneOf", "allOf",
               "contains", "propertyNames", "if", "then", "else", "unevaluatedProperties",
               "unevaluatedItems", "additionalItems", "not")
_JSON_TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")


def _walk(schema: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if not isinstance(schema, dict):
        return
    yield path, schema
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                yield from _walk(sub, f"{path}/{key}/{name}")
    for key in _SUBSCHEMAS:
        value = schema.get(key)
        if isinstance(value, list):
            for i, sub in enumerate(value):
                yield from _walk(sub, f"{path}/{key}/{i}")
        else:
            yield from _walk(value, f"{path}/{key}")


def _declared(schema: Any) -> set[str] | None:
    """The types a subschema's `type` names; None when it names none."""
    declared = schema.get("type") if isinstance(schema, dict) else None
    names = [declared] if isinstance(declared, str) else declared
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else None


def _types(schema: Any) -> set[str]:
    """The JSON types a subschema allows by its `type` (all when it names none)."""
    allowed = _declared(schema)
    if allowed is None:
        return set(_JSON_TYPES)
    if "number" in allowed:
        allowed.add("integer")  # every integer is a number
    return allowed


def unenforced_schema_reason(text: str) -> str | None:
    """Why the schema cannot be compiled faithfully, or None. Text that is not JSON is left to
    xgrammar's own message."""
    try:
        schema = json.loads(text)
        for path, node in _walk(schema, ""):
            where = path or "/"
            if "not" in node:
                return (f"'not' at {where} is not enforced by the grammar compiler "
                        "(xgrammar); express the allowed values positively")
            branches = node.get("allOf")
            if isinstance(branches, list) and len(branches) > 1:
                common = set.intersection(*(_types(b) for b in branches))
                if not common:
                    named = " and ".join(sorted(set().union(
                        *(_declared(b) or set() for b in branches))))
                    return (f"allOf at {where} is unsatisfiable: no value has all of the "
                            f"types {named}")
                return (f"allOf at {where} has {len(branches)} subschemas, which the grammar "
                        "compiler (xgrammar) does not enforce together; merge them into one "
                        "schema")
    except (ValueError, RecursionError):
        return None
    return None
