"""A JSON schema as xgrammar is given it: the same constraints, said the way it enforces them.

xgrammar 0.2 compiles a string's minLength/maxLength into a repetition of a bare character
class that admits raw control characters (U+0000-U+001F but CR and LF) and no escapes: the
output is then not JSON at all ("Invalid control character"). Its `pattern` path reads the
regular expression as one over the decoded string and writes JSON-escaped text, so the
lengths are handed over as the pattern `^[\\s\\S]{min,max}$` instead (schema_checks.py
refuses them where a pattern or a format already stands beside them).
"""

from __future__ import annotations

import json
from typing import Any

from warmgate.server.serving.grammar.schema_text import walk


def _length_pattern(node: dict[str, Any]) -> str | None:
    least, most = node.get("minLength", 0), node.get("maxLength")
    if not isinstance(least, int) or isinstance(least, bool) or least < 0:
        return None
    if most is not None and (not isinstance(most, int) or isinstance(most, bool)
                             or most < least):
        return None  # xgrammar says what is wrong with them
    return f"^[\\s\\S]{{{least},{'' if most is None else most}}}$"


def enforceable_schema(text: str) -> str:
    """`text` with the string lengths xgrammar would not enforce as a pattern; `text` itself
    when there are none (or it is not JSON: xgrammar then says why)."""
    if "Length" not in text:
        return text
    try:
        schema = json.loads(text)
    except (ValueError, RecursionError):
        return text
    changed = False
    for _, node in walk(schema):
        declared = node.get("type")
        strings = declared == "string" or (isinstance(declared, list) and "string" in declared)
        if not strings or "pattern" in node or "format" in node:
            continue
        if "minLength" not in node and "maxLength" not in node:
            continue
        pattern = _length_pattern(node)
        if pattern is not None:
            node.pop("minLength", None)
            node.pop("maxLength", None)
            node["pattern"] = pattern
            changed = True
    return json.dumps(schema) if changed else text
