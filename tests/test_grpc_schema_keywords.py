"""JSON-schema keywords against a live server: each one the grammar would not enforce is
INVALID_ARGUMENT naming it before any token; a schema nested past the server's depth (the
unsatisfiable allOf hidden under deep "examples") and a number no double holds are
INVALID_ARGUMENT saying so; schemas whose keywords are enforced finish STOP with output that
validates with `jsonschema`, sampled at random. Each keyword's rule, and random walks
through every schema let through: test_schema_keywords.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import pytest

from tests.grpc_harness import grammar_probes_idle, run, server_config, serving
from tests.test_grpc_grammar_limits import _error_of
from tests.test_grpc_structured import EOS
from tests.test_grpc_text import collect
from tests.test_schema_keywords import REFUSED
from tests.text_helpers import write_tiny_model
from warmgate.client.aio import AsyncWarmgateClient

FIELD = "sampling.json_schema"
SEEDS = range(4)
# Bounded, so that random output ends within max_tokens.
SERVED: list[dict[str, Any]] = [
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                      "b": {"enum": ["x", "y"]}},
     "required": ["a", "b"], "additionalProperties": False},
    {"type": "string", "minLength": 1, "maxLength": 4},
    {"type": "object", "properties": {"s": {"type": "string", "maxLength": 3}},
     "required": ["s"], "additionalProperties": False},
    {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 99},
               {"type": "string", "maxLength": 2}]},
    {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True, "maxItems": 1},
    {"type": "integer", "multipleOf": 3, "minimum": 0, "maximum": 30},
    {"type": "string", "pattern": "^a", "enum": ["ab", "ac"]},
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-schema-keywords"),
                            eos_token_id=EOS)


def test_schema_keywords_are_refused_by_name_or_enforced(model_dir: Path) -> None:
    deep = "[" * 1100 + "]" * 1100
    hidden = f'{{"allOf": [{{"type": "string"}}, {{"type": "integer"}}], "examples": {deep}}}'
    texts: list[tuple[str, str]] = [(json.dumps(schema), f"'{keyword}'")
                                    for schema, keyword in REFUSED if keyword != "allOf"]
    texts += [(json.dumps({"allOf": [{"type": "number"}, {"minimum": 3}]}), "allOf at /"),
              (hidden, "nested 1101 levels deep"),
              ('{"type": "number", "maximum": 1e400}', "the number 1e400 is out of range")]

    async def body() -> None:
        async with serving(server_config("--model", str(model_dir))) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            await grammar_probes_idle(s)
            for text, words in texts:
                error, tokens = await _error_of(c, json_schema=text, max_tokens=8)
                assert error.code is grpc.StatusCode.INVALID_ARGUMENT, (text, error)
                [violation] = error.field_violations
                assert violation.subject == FIELD and words in violation.description, (
                    text, violation)
                assert tokens == 0
            for schema in SERVED:
                for seed in SEEDS:
                    got, _ = await collect(c, [1, 2, 3], json_schema=json.dumps(schema),
                                           temperature=1.0, seed=seed, max_tokens=48)
                    assert got.finish_reason == "stop", (schema, got)
                    jsonschema.validate(json.loads(got.text), schema)

    run(body(), 300)
