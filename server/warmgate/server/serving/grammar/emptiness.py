"""Whether a grammar admits no string at all, read from xgrammar's serialized grammar.

xgrammar compiles `[^\\s\\S]`, `root ::= a` with `a ::= a`, or a JSON schema whose pattern is
one of them, without complaint; the matcher then allows no token (or, after a JSON string's
opening quote, none), and the sampler would draw from an all-masked row. The classic
productive-symbol fixpoint finds these before any step: a rule is productive when some
alternative of its body is made only of terminals that match something and productive rules.
The root being unproductive means no string matches.

The analysis reads xgrammar's expression arena (Grammar.serialize_json: `rules`, and every
expression as [type, length, data...] in `grammar_expr_data`, its offsets in
`grammar_expr_indptr`). Expression kinds it does not know count as productive, so a newer
xgrammar can only make it miss an empty grammar, never refuse a usable one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

MAX_CODEPOINT = 0x10FFFF
# The kinds of xgrammar's GrammarExprType (cpp/grammar_impl.h) that can match nothing.
CHAR_CLASS, RULE_REF, SEQUENCE, CHOICES, REPEAT = 1, 4, 5, 6, 8


def _class_matches_something(data: Sequence[int]) -> bool:
    """data: [is_negative, lower0, upper0, ...] (codepoints, inclusive)."""
    ranges = sorted((lo, hi) for lo, hi in zip(data[1::2], data[2::2], strict=True) if lo <= hi)
    if not data[0]:
        return bool(ranges)
    covered_to = -1  # a negated class matches what its ranges leave uncovered
    for lo, hi in ranges:
        if lo > covered_to + 1:
            return True
        covered_to = max(covered_to, hi)
    return covered_to < MAX_CODEPOINT


class _Arena:
    def __init__(self, serialized: str) -> None:
        doc = json.loads(serialized)
        data, indptr = doc["grammar_expr_data"], doc["grammar_expr_indptr"]
        if len(indptr) > len(data):  # an xgrammar that writes the two names swapped
            data, indptr = indptr, data
        self.data: list[int] = data
        self.indptr: list[int] = indptr
        self.rule_bodies: list[int] = [int(rule[1]) for rule in doc["rules"]]
        self.root = int(doc["root_rule_id"])

    def expr(self, expr_id: int) -> tuple[int, list[int]]:
        start = self.indptr[expr_id]
        return self.data[start], self.data[start + 2:start + 2 + self.data[start + 1]]


def _productive(arena: _Arena, expr_id: int, rules: set[int]) -> bool:
    """Whether the expression matches some string, given the rules known productive."""
    kind, data = arena.expr(expr_id)
    if kind == CHAR_CLASS:
        return _class_matches_something(data)
    if kind == RULE_REF:
        return data[0] in rules
    if kind == SEQUENCE:
        return all(_productive(arena, e, rules) for e in data)
    if kind == CHOICES:
        return any(_productive(arena, e, rules) for e in data)
    if kind == REPEAT:  # [rule_id, min, max]
        return data[1] == 0 or data[0] in rules
    # Byte strings, X*, the empty string (all match something), and the kinds this module
    # does not know (assumed to, so that it never refuses a usable grammar).
    return True


class NestedTooDeep(Exception):
    """An expression nested deeper than the analysis can follow (Python's recursion limit):
    whether any string matches is unknown, so the grammar is not served."""


def admits_no_string(serialized_grammar: str) -> bool:
    """True when the grammar (xgrammar's Grammar.serialize_json) matches no string: its root
    rule can never finish. NestedTooDeep where it cannot tell."""
    try:
        return _root_unproductive(_Arena(serialized_grammar))
    except RecursionError:
        raise NestedTooDeep() from None


def _root_unproductive(arena: _Arena) -> bool:
    productive: set[int] = set()
    changed = True
    while changed:  # at most one pass per rule
        changed = False
        for rule_id, body in enumerate(arena.rule_bodies):
            if rule_id not in productive and _productive(arena, body, productive):
                productive.add(rule_id)
                changed = True
    return arena.root not in productive
