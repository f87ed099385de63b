"""JSON-schema keywords: each one xgrammar would serve without enforcing is refused naming it,
and every schema the server lets through compiles to a grammar whose every output validates
with `jsonschema` (random walks through the compiled grammar stand in for a model). The
schema's text is bounded first: nesting past the server's depth and numbers no double holds
are refused with that said. Live, over gRPC: test_grpc_schema_keywords.py."""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema
import pytest
import torch
import xgrammar as xgr
from tokenizers import Tokenizer

from tests.text_helpers import train_tokenizer
from warmgate.server.serving.grammar.emptiness import (
    CHAR_CLASS,
    SEQUENCE,
    NestedTooDeep,
    admits_no_string,
)
from warmgate.server.serving.grammar.front_end import check_grammar, parse
from warmgate.server.serving.grammar.schema_checks import unenforced_schema_reason
from warmgate.server.serving.grammar.schema_text import MAX_SCHEMA_DEPTH, nesting_depth
from warmgate.server.serving.grammar.spec import GrammarError, GrammarSpec
from warmgate.server.serving.grammar.tokenizer_info import tokenizer_info_of

VOCAB = 512
EOS = 2
WALKS = 24
MAX_WALK_TOKENS = 400
# Tokens that close what a walk opened: preferred now and then, so that walks end.
CLOSING = set('"{}[],:0123456789-.')

# (schema, the keyword the refusal names): each is served by xgrammar with output that
# breaks it.
REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"type": "integer", "const": "a"}, "const"),
    ({"type": "string", "enum": [1, 2]}, "enum"),
    ({"type": "string", "pattern": "^a$", "enum": ["b"]}, "enum"),
    ({"type": "object", "required": ["a"], "additionalProperties": False}, "required"),
    ({"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["a"]},
     "required"),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
    ({"type": "object", "properties": {"a": {"type": "integer"}},
      "dependentSchemas": {"a": {"required": ["b"]}}}, "dependentSchemas"),
    ({"type": "object", "dependencies": {"a": ["b"]}}, "dependencies"),
    ({"type": "array", "contains": {"type": "integer"}, "minContains": 2}, "contains"),
    ({"if": {"type": "string"}, "then": {"minLength": 3}}, "if"),
    ({"type": "array", "items": {"type": "boolean"}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "object", "propertyNames": {"enum": ["x", "y"]}, "minProperties": 2},
     "propertyNames"),
    ({"minimum": 5}, "minimum"),
    ({"pattern": "^a$"}, "pattern"),
    ({"type": "number", "multipleOf": 0.5}, "multipleOf"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),
    ({"type": "integer", "anyOf": [{"minimum": 5}, {"maximum": 1}]}, "anyOf"),
    ({"type": "integer", "allOf": [{"minimum": 3}]}, "allOf"),
    ({"$ref": "#/$defs/a", "maximum": 3, "$defs": {"a": {"type": "integer"}}}, "$ref"),
    ({"type": "object", "properties": {"ab": {"type": "string"}},
      "patternProperties": {"^a": {"type": "integer"}}}, "patternProperties"),
    ({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2},
     "minProperties"),
    ({"type": "string", "pattern": "^a+$", "maxLength": 3}, "maxLength"),
    ({"type": "string", "format": "email", "minLength": 30}, "minLength"),
    ({"type": "array", "unevaluatedItems": False}, "unevaluatedItems"),
    ({"const": {"a": 1}, "type": "object", "properties": {"a": {"type": "string"}}},
     "const"),
    ({"items": {"not": {"type": "string"}}}, "not"),
    ({"allOf": [{"type": "number"}, {"minimum": 3}]}, "allOf"),
]

# Schemas served as they are: each keyword here xgrammar enforces (or the server rewrites so
# that it does: string lengths).
ENFORCED: list[dict[str, Any]] = [
    {"type": "string", "pattern": "^a", "enum": ["ab", "ac"]},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True, "maxItems": 1},
    {"type": "integer", "minimum": 5, "maximum": 9},
    {"type": "integer", "multipleOf": 3, "minimum": 0, "maximum": 20},
    {"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]},
    {"oneOf": [{"const": "a"}, {"const": "b"}]},
    {"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"],
                "additionalProperties": False},
               {"type": "object", "properties": {"k": {"const": "b"}, "v": {"type": "integer"}},
                "required": ["k"], "additionalProperties": False}]},
    {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]},
    {"type": "object", "patternProperties": {"^a": {"type": "integer"}},
     "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
     "minProperties": 1, "additionalProperties": False},
    {"$ref": "#/$defs/a", "description": "refs keep annotations",
     "$defs": {"a": {"type": "integer", "maximum": 3}}},
    {"type": "string", "minLength": 2, "maxLength": 4},
    {"type": ["string", "null"], "maxLength": 3},
    {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string", "maxLength": 2}],
     "items": False},
    {"type": "object", "properties": {"a": {"type": "integer"}},
     "additionalProperties": {"type": "string", "maxLength": 2}},
    {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3},
    {"enum": ["a", 1, None, {"x": 1}, [1]]},
    {"type": "integer", "enum": [1, 2.0, 3]},
    {"type": "number", "minimum": -1.5, "maximum": 2.25},
    {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
    {"items": {"type": "integer"}, "minItems": 1},
    {"allOf": [{"type": "integer", "minimum": 3}]},
    {"type": "object", "properties": {"a": {"type": "integer"}, "x-order": {"type": "null"}},
     "required": ["a"], "x-unknown-keyword": True},
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_tokenizer("byte_level")


@pytest.fixture(scope="module")
def compiler(tokenizer: Tokenizer) -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(tokenizer_info_of(tokenizer, VOCAB, [EOS]), cache_enabled=False)


def _walk(compiled: xgr.CompiledGrammar, tokenizer: Tokenizer, rng: random.Random
          ) -> str | None:
    """A random output the grammar admits (a model drawing at random under its bitmask);
    None when it did not end within MAX_WALK_TOKENS."""
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, VOCAB)
    closing = {i for i in range(tokenizer.get_vocab_size())
               if (text := tokenizer.decode([i])) and set(text) <= CLOSING}
    ids: list[int] = []
    for _ in range(MAX_WALK_TOKENS):
        if matcher.is_terminated():
            return tokenizer.decode(ids)
        matcher.fill_next_token_bitmask(bitmask)
        bits = bitmask[0].to(torch.int64) & 0xFFFFFFFF
        allowed = [i for i in range(VOCAB) if (int(bits[i // 32]) >> (i % 32)) & 1]
        if EOS in allowed and rng.random() < 0.7:
            token = EOS
        else:
            short = [i for i in allowed if i in closing]
            token = rng.choice(short if short and rng.random() < 0.6 else allowed)
        assert matcher.accept_token(token)
        if token != EOS:
            ids.append(token)
    return None


@pytest.mark.parametrize(("schema", "keyword"), REFUSED,
                         ids=[f"{k}-{i}" for i, (_, k) in enumerate(REFUSED)])
def test_a_keyword_the_grammar_would_not_enforce_is_refused_by_name(
        schema: dict[str, Any], keyword: str) -> None:
    reason = unenforced_schema_reason(json.dumps(schema))
    assert reason is not None, schema
    assert f"'{keyword}'" in reason or reason.startswith(f"{keyword} at /"), reason
    assert " at /" in reason  # and where it is


@pytest.mark.parametrize("schema", ENFORCED, ids=[str(i) for i in range(len(ENFORCED))])
def test_every_output_of_a_schema_let_through_validates(
        schema: dict[str, Any], compiler: xgr.GrammarCompiler, tokenizer: Tokenizer) -> None:
    text = json.dumps(schema)
    assert unenforced_schema_reason(text) is None
    compiled = compiler.compile_grammar(parse(GrammarSpec("json_schema", text)))
    rng = random.Random(len(text))
    checked = 0
    for _ in range(WALKS):
        output = _walk(compiled, tokenizer, rng)
        # Byte-level tokens can spell bytes that are no UTF-8 a model would write.
        if output is None or "\ufffd" in output:
            continue
        jsonschema.validate(json.loads(output), schema)
        checked += 1
    assert checked >= WALKS // 3, f"only {checked} walks ended"


def test_a_schema_nested_past_the_servers_depth_is_refused_saying_so() -> None:
    deep = "[" * 1100 + "]" * 1100
    text = f'{{"allOf": [{{"type": "string"}}, {{"type": "integer"}}], "examples": {deep}}}'
    assert nesting_depth(text) == 1101
    reason = unenforced_schema_reason(text)
    assert reason == (f"nested 1101 levels deep (arrays and objects); the server checks "
                      f"schemas up to {MAX_SCHEMA_DEPTH} levels")
    # Brackets inside strings are text, not nesting.
    assert nesting_depth(json.dumps({"pattern": "[[[[{{{{" * 50})) == 1
    fits = {"type": "array", "items": {"type": "array"}}
    for _ in range(MAX_SCHEMA_DEPTH // 2 - 1):
        fits = {"type": "array", "items": fits}
    assert nesting_depth(json.dumps(fits)) <= MAX_SCHEMA_DEPTH
    assert unenforced_schema_reason(json.dumps(fits)) is None


def test_a_grammar_nested_past_what_the_emptiness_check_follows_is_refused() -> None:
    """xgrammar's arena as serialize_json writes it: a sequence inside a sequence, 5,000
    deep, around a character class. Whether it admits a string is not known, so it is not
    served (it used to be, as if it did)."""
    depth = 5000
    data: list[int] = []
    indptr: list[int] = []
    for i in range(depth):
        indptr.append(len(data))
        data += [SEQUENCE, 1, i + 1]
    indptr.append(len(data))
    data += [CHAR_CLASS, 3, 0, ord("a"), ord("a")]
    arena = json.dumps({"rules": [["root", 0]], "root_rule_id": 0,
                        "grammar_expr_data": data, "grammar_expr_indptr": indptr})
    with pytest.raises(NestedTooDeep):
        admits_no_string(arena)

    class Deep:
        def serialize_json(self) -> str:
            return arena

    with pytest.raises(GrammarError, match="nests too deeply for the server to check"):
        check_grammar(GrammarSpec("ebnf", "root ::= ..."), Deep())  # type: ignore[arg-type]


@pytest.mark.parametrize("number", ["1e400", "-1e400", "NaN", "Infinity"])
def test_a_number_no_double_holds_is_refused_saying_so(number: str) -> None:
    reason = unenforced_schema_reason(f'{{"type": "number", "maximum": {number}}}')
    assert reason is not None
    assert (f"the number {number} is out of range" in reason if "e" in number
            else f"{number} is not a JSON number" in reason), reason
