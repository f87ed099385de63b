"""Whether a JSON value satisfies a schema, for the few places the server must know before
compiling: the values of an `enum` or `const` (xgrammar writes them as they are, whatever
their schema's other keywords say) and the branches of a `oneOf` (which must exclude each
other). A small validator of JSON Schema's value keywords; a keyword it cannot judge raises
Unchecked naming it, so that the caller refuses rather than guesses.
"""

from __future__ import annotations

import math
import re
from typing import Any

# Keywords that say nothing about a value's validity.
ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
    "writeOnly", "$schema", "$id", "$anchor", "format", "contentMediaType", "contentEncoding",
    "contentSchema", "$defs", "definitions", "discriminator", "example", "nullable"})
# Every keyword of JSON Schema (2020-12, and the earlier drafts') that constrains a value. A
# keyword outside these and ANNOTATIONS is not JSON Schema's (x-order, propertyOrder): a
# validator ignores it, and so does this one.
ASSERTIONS = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems",
    "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties", "required",
    "dependentRequired", "allOf", "anyOf", "oneOf", "not", "if", "then", "else",
    "dependentSchemas", "prefixItems", "items", "contains", "properties", "patternProperties",
    "additionalProperties", "propertyNames", "unevaluatedItems", "unevaluatedProperties",
    "additionalItems", "dependencies", "$ref", "$dynamicRef", "$recursiveRef"})
_TYPES = {"null", "boolean", "object", "array", "number", "string", "integer"}


class Unchecked(Exception):
    """A keyword this validator does not judge."""

    def __init__(self, keyword: str) -> None:
        super().__init__(keyword)
        self.keyword = keyword


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON has it: 1 == 1.0, but true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _has_type(value: Any, name: str) -> bool:
    actual = json_type(value)
    return actual == name or (name == "number" and actual == "integer")


def violation(value: Any, schema: Any) -> str | None:
    """The keyword `value` breaks in `schema` (None: it satisfies it); Unchecked for a
    keyword this validator does not judge."""
    if schema is True or schema == {}:
        return None
    if schema is False:
        return "false"
    if not isinstance(schema, dict):
        raise Unchecked("a subschema that is not an object")
    for keyword, rule in schema.items():
        if keyword not in ASSERTIONS:
            continue
        broken = _check(keyword, rule, value, schema)
        if broken is not None:
            return broken
    return None


def _check(keyword: str, rule: Any, value: Any, schema: dict[str, Any]) -> str | None:
    check = _CHECKS.get(keyword)
    if check is None:
        if keyword in _APPLIED_BY_OTHERS:
            return None
        raise Unchecked(keyword)
    return keyword if not check(rule, value, schema) else None


def _type_ok(rule: Any, value: Any, _: dict[str, Any]) -> bool:
    names = [rule] if isinstance(rule, str) else rule
    if not isinstance(names, list) or not all(n in _TYPES for n in names):
        raise Unchecked("type")
    return any(_has_type(value, n) for n in names)


def _enum_ok(rule: Any, value: Any, _: dict[str, Any]) -> bool:
    if not isinstance(rule, list):
        raise Unchecked("enum")
    return any(json_equal(value, v) for v in rule)


def _number(rule: Any, keyword: str) -> float:
    if isinstance(rule, bool) or not isinstance(rule, (int, float)):
        raise Unchecked(keyword)
    return rule


def _numeric(keyword: str, holds: Any) -> Any:
    def ok(rule: Any, value: Any, _: dict[str, Any]) -> bool:
        bound = _number(rule, keyword)
        return not _has_type(value, "number") or bool(holds(value, bound))
    return ok


def _multiple_ok(rule: Any, value: Any, _: dict[str, Any]) -> bool:
    step = _number(rule, "multipleOf")
    if not _has_type(value, "number"):
        return True
    if step <= 0:
        raise Unchecked("multipleOf")
    if isinstance(value, int) and isinstance(step, int):
        return value % step == 0
    quotient = value / step
    return math.isfinite(quotient) and abs(quotient - round(quotient)) < 1e-9


def _sized(kind: str, keyword: str, holds: Any) -> Any:
    def ok(rule: Any, value: Any, _: dict[str, Any]) -> bool:
        if isinstance(rule, bool) or not isinstance(rule, int):
            raise Unchecked(keyword)
        return not _has_type(value, kind) or bool(holds(len(value), rule))
    return ok


def _pattern_ok(rule: Any, value: Any, _: dict[str, Any]) -> bool:
    if not isinstance(value, str):
        return True
    try:
        return re.search(rule, value) is not None
    except (re.error, TypeError):  # ECMA-262 syntax Python's re does not read
        raise Unchecked("pattern") from None


def _items_ok(rule: Any, value: Any, schema: dict[str, Any]) -> bool:
    if not isinstance(value, list):
        return True
    prefix = schema.get("prefixItems", [])
    if not isinstance(prefix, list):
        raise Unchecked("prefixItems")
    return all(violation(v, rule) is None for v in value[len(prefix):])


def _prefix_ok(rule: Any, value: Any, _: dict[str, Any]) -> bool:
    if not isinstance(rule, list):
        raise Unchecked("prefixItems")
    return not isinstance(value, list) or all(
        violation(v, s) is None for v, s in zip(value, rule, strict=False))


def _unique_ok(rule: Any, value: Any, _: dict[str, Any]) -> bool:
    if not rule or not isinstance(value, list):
        return True
    return not any(json_equal(a, b) for i, a in enumerate(value) for b in value[i + 1:])


def _required_ok(rule: Any, value: Any, _: dict[str, Any]) -> bool:
    return not isinstance(value, dict) or all(name in value for name in rule)


def _properties_ok(rule: Any, value: Any, _: dict[str, Any]) -> bool:
    if not isinstance(value, dict):
        return True
    return all(violation(value[name], sub) is None for name, sub in rule.items()
               if name in value)


def _matching(schema: dict[str, Any], name: str) -> list[Any]:
    patterns = schema.get("patternProperties", {})
    try:
        return [sub for pattern, sub in patterns.items() if re.search(pattern, name)]
    except re.error:
        raise Unchecked("patternProperties") from None


def _pattern_properties_ok(rule: Any, value: Any, schema: dict[str, Any]) -> bool:
    if not isinstance(value, dict):
        return True
    return all(violation(v, sub) is None for name, v in value.items()
               for sub in _matching(schema, name))


def _additional_ok(rule: Any, value: Any, schema: dict[str, Any]) -> bool:
    if not isinstance(value, dict):
        return True
    listed = schema.get("properties", {})
    return all(violation(v, rule) is None for name, v in value.items()
               if name not in listed and not _matching(schema, name))


_CHECKS: dict[str, Any] = {
    "type": _type_ok,
    "enum": _enum_ok,
    "const": lambda rule, value, _: json_equal(value, rule),
    "minimum": _numeric("minimum", lambda v, b: v >= b),
    "maximum": _numeric("maximum", lambda v, b: v <= b),
    "exclusiveMinimum": _numeric("exclusiveMinimum", lambda v, b: v > b),
    "exclusiveMaximum": _numeric("exclusiveMaximum", lambda v, b: v < b),
    "multipleOf": _multiple_ok,
    "minLength": _sized("string", "minLength", lambda n, b: n >= b),
    "maxLength": _sized("string", "maxLength", lambda n, b: n <= b),
    "minItems": _sized("array", "minItems", lambda n, b: n >= b),
    "maxItems": _sized("array", "maxItems", lambda n, b: n <= b),
    "minProperties": _sized("object", "minProperties", lambda n, b: n >= b),
    "maxProperties": _sized("object", "maxProperties", lambda n, b: n <= b),
    "pattern": _pattern_ok,
    "items": _items_ok,
    "prefixItems": _prefix_ok,
    "uniqueItems": _unique_ok,
    "required": _required_ok,
    "properties": _properties_ok,
    "patternProperties": _pattern_properties_ok,
    "additionalProperties": _additional_ok,
}
# Judged by another keyword's check (minContains and maxContains do nothing without
# contains, then/else nothing without if: those are refused before any value is judged).
_APPLIED_BY_OTHERS = frozenset({"minContains", "maxContains", "then", "else"})
