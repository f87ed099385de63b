"""JSON-schema keywords xgrammar accepts but does not enforce, refused before compiling.

xgrammar 0.2 compiles many schemas into a grammar that admits output the schema rejects: it
ignores `if`/`then`, `dependentRequired`, `dependentSchemas`, `contains`, `uniqueItems`,
`not`, a second subschema of `allOf`, every keyword beside `anyOf`/`oneOf`/`allOf`/`$ref`,
the type-specific keywords of an untyped schema (`{"minimum": 5}` admits 3), `multipleOf`
on numbers; it writes an `enum`'s or a `const`'s values whatever the schema's `type` or
`pattern` say; it writes only listed properties, so a `required` name missing from
`properties` never appears; it enforces `oneOf` as `anyOf`; `propertyNames` is ignored
beside `properties` and, like `patternProperties`, lets a name repeat (so `minProperties`
can count fewer). A finish the schema does not hold for is worse than a refusal, so each of
these is INVALID_ARGUMENT naming the keyword and where it is (a JSON pointer), or checked
and let through where the output then holds (enum values that satisfy their schema,
`oneOf` branches that exclude each other, required names that are listed). Contradictory
bounds (minLength > maxLength, an empty enum) xgrammar refuses itself.

Before any of it the text itself is read by schema_text (its nesting and its numbers bounded).
"""

from __future__ import annotations

import json
import re
from typing import Any

from warmgate.server.serving.grammar.schema_text import (
    SchemaRefused,
    load_schema,
    walk,
)
from warmgate.server.serving.grammar.schema_values import (
    ASSERTIONS,
    Unchecked,
    violation,
)

_JSON_TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
_COMBINATORS = ("anyOf", "oneOf", "allOf", "$ref")
# Keywords that only apply to one kind of value, and that xgrammar applies only where the
# schema says (or, for objects and arrays, implies) that kind.
_KIND_KEYWORDS = {
    "pattern": "string", "minLength": "string", "maxLength": "string",
    "minimum": "number", "maximum": "number", "exclusiveMinimum": "number",
    "exclusiveMaximum": "number", "multipleOf": "number",
    "minItems": "array", "maxItems": "array",
    "minProperties": "object", "maxProperties": "object", "required": "object",
}
# What xgrammar infers an untyped schema to be from its structure.
_IMPLYING = {"properties": "object", "patternProperties": "object",
             "additionalProperties": "object", "items": "array", "prefixItems": "array"}
_NOT_ENFORCED = {
    "dependentRequired": "list the properties as required, or write the cases out as anyOf",
    "dependentSchemas": "write the cases out as anyOf of complete schemas",
    "dependencies": "write the cases out as anyOf of complete schemas",
    "propertyNames": "list the properties, or use patternProperties",
    "unevaluatedItems": "use items",
    "additionalItems": "use items",
    "$dynamicRef": "use $ref",
    "$recursiveRef": "use $ref",
}


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


def _kinds(node: dict[str, Any]) -> set[str] | None:
    """The kinds of value xgrammar writes for `node` by its type, or implies by its
    structure; None when it may write any."""
    declared = _declared(node)
    if declared is not None:
        return declared | ({"number"} if "integer" in declared else set())
    implied = {kind for key, kind in _IMPLYING.items() if key in node}
    return implied if len(implied) == 1 else None


def _pinned(node: Any) -> list[Any] | None:
    """The values an enum or const pins a subschema to; None when it pins none."""
    if not isinstance(node, dict):
        return None
    if "const" in node:
        return [node["const"]]
    enum = node.get("enum")
    return list(enum) if isinstance(enum, list) else None


def _excludes(a: Any, b: Any, depth: int = 0) -> bool:
    """Whether no value satisfies both subschemas, as far as can be shown cheaply: by their
    types, their pinned values, or a property both require with such subschemas."""
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict) or depth > 4:
        return False
    if not _types(a) & _types(b):
        return True
    for pinned, other in ((_pinned(a), b), (_pinned(b), a)):
        if pinned is not None:
            try:
                if all(violation(v, other) is not None for v in pinned):
                    return True
            except Unchecked:
                pass
    required_a, required_b = a.get("required", []), b.get("required", [])
    if not isinstance(required_a, list) or not isinstance(required_b, list):
        return False
    shared = {n for n in required_a if isinstance(n, str)} & set(required_b)
    props_a, props_b = a.get("properties", {}), b.get("properties", {})
    return isinstance(props_a, dict) and isinstance(props_b, dict) and any(
        _excludes(props_a.get(n, True), props_b.get(n, True), depth + 1) for n in shared)


def _assertions(node: dict[str, Any]) -> list[str]:
    """Keywords of `node` that constrain its value (annotations, definitions and keywords
    JSON Schema does not know left out: a validator ignores those too)."""
    return [k for k in node if k in ASSERTIONS]


def _not_enforced(keyword: str, where: str, how: str) -> str:
    return (f"{keyword!r} at {where} is not enforced by the grammar compiler (xgrammar), so "
            f"output could break it; {how}")


def _refused_keyword(node: dict[str, Any], where: str) -> str | None:
    if "not" in node:
        return (f"'not' at {where} is not enforced by the grammar compiler (xgrammar); "
                "express the allowed values positively")
    if "if" in node and any(node.get(k) not in (None, {}, True) for k in ("then", "else")):
        return _not_enforced("if", where, "write the cases out as anyOf of complete schemas")
    if "contains" in node:  # even {} asks for one item at least
        return _not_enforced("contains", where, "describe every item with items or "
                             "prefixItems, and the count with minItems")
    for keyword, how in _NOT_ENFORCED.items():
        value = node.get(keyword)
        # An empty value (or true) asks for nothing.
        if keyword in node and not (value == {} or value == [] or value is True):
            return _not_enforced(keyword, where, how)
    max_items = node.get("maxItems")
    if node.get("uniqueItems") is True and not (isinstance(max_items, int) and max_items <= 1):
        return _not_enforced("uniqueItems", where, "list distinct values as an enum of "
                             "arrays, or drop it")
    unevaluated = node.get("unevaluatedProperties")
    if "unevaluatedProperties" in node and not (unevaluated is False or unevaluated is True
                                                or unevaluated == {}):
        return _not_enforced("unevaluatedProperties", where, "use additionalProperties")
    return None


def _all_of(node: dict[str, Any], where: str) -> str | None:
    branches = node.get("allOf")
    if not isinstance(branches, list) or len(branches) <= 1:
        return None
    common = set.intersection(*(_types(b) for b in branches))
    if not common:
        named = " and ".join(sorted(set().union(*(_declared(b) or set() for b in branches))))
        return f"allOf at {where} is unsatisfiable: no value has all of the types {named}"
    return (f"allOf at {where} has {len(branches)} subschemas, which the grammar compiler "
            "(xgrammar) does not enforce together; merge them into one schema")


def _combined(node: dict[str, Any], where: str) -> str | None:
    """A combinator beside other assertions, which xgrammar drops; oneOf that could match
    twice, which it enforces as anyOf."""
    combinators = [k for k in _COMBINATORS if k in node]
    if not combinators:
        return None
    others = [k for k in _assertions(node) if k != combinators[0]]
    if others:
        return (f"{combinators[0]!r} at {where} beside {others[0]!r}: the grammar compiler "
                f"(xgrammar) does not apply {others[0]!r} to it; move {others[0]!r} into "
                f"each of its subschemas")
    branches = node.get("oneOf")
    if isinstance(branches, list):
        for i, a in enumerate(branches):
            for j in range(i + 1, len(branches)):
                if not _excludes(a, branches[j]):
                    return (f"'oneOf' at {where}: subschemas {i} and {j} may both match a "
                            "value, and the grammar compiler (xgrammar) enforces oneOf as "
                            "anyOf; make them exclusive (distinct types or const values) "
                            "or use anyOf")
    return None


def _kind_keywords(node: dict[str, Any], where: str) -> str | None:
    kinds = _kinds(node)
    for keyword in _KIND_KEYWORDS:
        if keyword not in node or _pinned(node) is not None:
            continue
        if kinds is None:
            return (f"{keyword!r} at {where} needs a \"type\" beside it: the grammar "
                    "compiler (xgrammar) applies it only to a typed schema")
        if keyword == "multipleOf" and "number" in kinds:
            step = node["multipleOf"]
            integral = (not isinstance(step, bool) and isinstance(step, (int, float))
                        and float(step).is_integer())
            if (_declared(node) or set()) & {"number"} or not integral:
                return (f"'multipleOf' at {where} is enforced by the grammar compiler "
                        "(xgrammar) only for \"type\": \"integer\" and an integer step")
    return None


def _string_lengths(node: dict[str, Any], where: str) -> str | None:
    """xgrammar drops minLength and maxLength beside a pattern or a format."""
    for keyword in ("minLength", "maxLength"):
        for other in ("pattern", "format"):
            if keyword in node and other in node and _pinned(node) is None:
                return (f"{keyword!r} at {where} beside {other!r}: the grammar compiler "
                        f"(xgrammar) ignores it there; put the length into a pattern")
    return None


def _object_keywords(node: dict[str, Any], where: str) -> str | None:
    listed = node.get("properties", {})
    listed = listed if isinstance(listed, dict) else {}
    kinds = _kinds(node)
    required = node.get("required", [])
    required = required if isinstance(required, list) else []
    if kinds is None or "object" in kinds:
        for name in required:
            if name not in listed:
                return (f"'required' at {where} names {name!r}, which is not in its "
                        "properties: the grammar compiler (xgrammar) writes only properties "
                        "listed there")
    patterns = node.get("patternProperties", {})
    if isinstance(patterns, dict) and patterns:
        for pattern in patterns:
            try:
                overlap = [name for name in listed if re.search(pattern, name)]
            except re.error:
                overlap = list(listed)
            if overlap:
                return (f"'patternProperties' at {where}: property {overlap[0]!r} matches "
                        f"{pattern!r} too, and the grammar compiler (xgrammar) applies only "
                        "its properties entry; make the patterns exclude the listed names")
    free = bool(patterns) or node.get("additionalProperties") not in (None, False)
    least = node.get("minProperties")
    if free and isinstance(least, int) and least > len(required):
        return (f"'minProperties' at {where} is not enforced beside free property names: "
                "the grammar compiler (xgrammar) can repeat a name, which counts once; "
                "require that many listed properties instead")
    return None


def _pinned_values(node: dict[str, Any], where: str) -> str | None:
    """xgrammar writes an enum's or const's values as they are: each must satisfy the
    schema's other keywords."""
    pinned = _pinned(node)
    if pinned is None:
        return None
    keyword = "const" if "const" in node else "enum"
    rest = {k: v for k, v in node.items() if k not in ("enum", "const")}
    if "const" in node and "enum" in node:
        rest["enum"] = node["enum"]
    try:
        for value in pinned:
            broken = violation(value, rest)
            if broken is not None:
                return (f"{keyword!r} at {where} holds {json.dumps(value)[:80]}, which its "
                        f"schema's {broken!r} rejects; list only values the schema allows")
    except Unchecked as exc:
        return (f"{keyword!r} at {where} beside {exc.keyword!r}: the grammar compiler "
                f"(xgrammar) writes the {keyword} values as they are, and the server cannot "
                f"check them against {exc.keyword!r}; drop one of them")
    return None


_NODE_CHECKS = (_refused_keyword, _all_of, _combined, _kind_keywords, _string_lengths,
                _object_keywords, _pinned_values)


def unenforced_schema_reason(text: str) -> str | None:
    """Why the schema cannot be compiled faithfully, or None. Text that is not JSON is left
    to xgrammar's own message."""
    try:
        schema = load_schema(text)
    except SchemaRefused as exc:
        return exc.message
    except ValueError:
        return None
    if not isinstance(schema, (dict, bool)):
        return None  # xgrammar says what a schema must be
    for path, node in walk(schema):
        for check in _NODE_CHECKS:
            reason = check(node, path or "/")
            if reason is not None:
                return reason
    return None
