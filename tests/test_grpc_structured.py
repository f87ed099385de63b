"""Structured output over gRPC: JSON schema, regex and EBNF requests on a model with a
tokenizer (the tiny model's seeded weights, so only the grammar makes its output valid),
with and without speculative decoding; INVALID_ARGUMENT naming the field for a model without
a tokenizer and for grammars that do not compile; the warmup's structured phase; the CLI."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.grpc_harness import ServerThread, grammar_probes_idle, run, server_config, serving
from tests.test_grpc_text import collect
from tests.text_helpers import write_tiny_model
from warmgate.client import cli
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.errors import WarmgateRpcError
from warmgate.client.generate import generate_request
from warmgate.v1 import warmup_pb2 as pb

EOS = 2  # <|im_end|> in the trained tokenizers (after <|endoftext|> and <|im_start|>)
REGEX = r"(yes|no), [0-9]{2}!"
SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                           "count": {"type": "integer"}},
          "required": ["answer", "count"], "additionalProperties": False}
EBNF = 'root ::= "(" item (", " item)* ")"\nitem ::= [a-c] | "x" [0-9]'
EBNF_RE = r"\((?:[a-c]|x[0-9])(?:, (?:[a-c]|x[0-9]))*\)"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-grammar"), eos_token_id=EOS)


def _check_schema(text: str) -> bool:
    value = json.loads(text)
    return (set(value) == {"answer", "count"} and value["answer"] in ("yes", "no")
            and isinstance(value["count"], int))


# The grammar's matcher rebuilt in an engine process too, from the spec the server compiled.
@pytest.mark.parametrize(("k", "engine"), [(0, "--no-engine-process"),
                                           (3, "--no-engine-process"), (3, "--engine-process")])
def test_constrained_outputs_match_their_grammar_beside_a_plain_request(model_dir: Path,
                                                                         k: int,
                                                                         engine: str) -> None:
    config = server_config("--model", str(model_dir), "--num-speculative-steps", str(k), engine)

    async def body() -> None:
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            report = await c.warmup_kernels()
            assert report.outcome == pb.WARMUP_OUTCOME_SUCCEEDED
            await grammar_probes_idle(s)
            plain, _ = await collect(c, prompt="The capital of France is", max_tokens=12,
                                     ignore_eos=True)
            cases: list[tuple[dict[str, Any], Any]] = [
                ({"regex": REGEX}, lambda t: re.fullmatch(REGEX, t)),
                ({"json_schema": json.dumps(SCHEMA)}, _check_schema),
                ({"ebnf": EBNF}, lambda t: re.fullmatch(EBNF_RE, t)),
                # Greedy and stochastic rows both take the mask.
                ({"regex": REGEX, "temperature": 1.0, "seed": 3},
                 lambda t: re.fullmatch(REGEX, t))]
            for kwargs, check in cases:
                got, _ = await collect(c, prompt="The capital of France is", max_tokens=200,
                                       **kwargs)
                assert got.finish_reason == "stop", (kwargs, got.text)
                assert got.token_ids[-1] == EOS
                assert check(got.text), (kwargs, got.text)
            # The unconstrained request's tokens are unchanged by the grammars around it.
            again, _ = await collect(c, prompt="The capital of France is", max_tokens=12,
                                     ignore_eos=True)
            assert again.token_ids == plain.token_ids
            structured = next(p for p in report.phases if p.name == "structured")
            assert structured.status == pb.PHASE_STATUS_RAN, structured.detail
            # Each grammar request counts once under the structured feature; plain ones not.
            assert s.metrics.registry.get_sample_value(
                "warmgate_generate_request_features_total",
                {"feature": "structured"}) == len(cases)

    run(body(), 240)


@pytest.mark.parametrize(("kwargs", "field", "words"), [
    ({"json_schema": "{not json"}, "sampling.json_schema", "Failed to parse JSON"),
    ({"json_schema": json.dumps({"type": "nonsense"})}, "sampling.json_schema", "nonsense"),
    ({"regex": "(ab"}, "sampling.regex", "parenthesis is not closed"),
    ({"ebnf": "root ::= foo"}, "sampling.ebnf", 'Rule "foo" is not defined'),
    ({"regex": "   "}, "sampling.regex", "is empty"),
    # A finished grammar allows only EOS, which min_tokens would mask: nothing left to sample.
    ({"regex": "(yes|no)", "min_tokens": 6}, "sampling.min_tokens",
     "cannot be combined with sampling.regex"),
])
def test_grammars_that_do_not_compile_are_invalid_argument_with_xgrammars_message(
        model_dir: Path, kwargs: dict[str, Any], field: str, words: str) -> None:
    async def body() -> None:
        async with serving(server_config("--model", str(model_dir), "--serve-before-ready",
                                         "--no-warmup-on-start")
                           ) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            await grammar_probes_idle(s)
            with pytest.raises(WarmgateRpcError) as info:
                await collect(c, [5, 6, 7], **kwargs)
            assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
            [violation] = info.value.field_violations
            assert violation.subject == field
            assert words in violation.description
            assert "\n" not in violation.description and ".cc:" not in violation.description

    run(body(), 120)


def test_a_model_without_a_tokenizer_refuses_grammars_and_skips_the_phase() -> None:
    async def body() -> None:
        async with serving(server_config("--model", "tiny", "--no-warmup-on-start")
                           ) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            report = await c.warmup_kernels()
            structured = next(p for p in report.phases if p.name == "structured")
            assert structured.status == pb.PHASE_STATUS_SKIPPED
            assert structured.skip_reason == pb.SKIP_REASON_NO_TOKENIZER
            assert "tokenizer" in structured.detail
            for kwargs, field in (({"json_schema": "{}"}, "sampling.json_schema"),
                                  ({"regex": "a+"}, "sampling.regex"),
                                  ({"ebnf": 'root ::= "a"'}, "sampling.ebnf")):
                with pytest.raises(WarmgateRpcError) as info:
                    await collect(c, [1, 2, 3], **kwargs)
                assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
                [violation] = info.value.field_violations
                assert violation.subject == field
                assert "needs the model's tokenizer" in violation.description

    run(body(), 120)


def test_a_model_without_eos_ids_refuses_grammars(tmp_path: Path) -> None:
    write_tiny_model(tmp_path)  # tokenizer.json, but no generation_config.json

    async def body() -> None:
        async with serving(server_config("--model", str(tmp_path), "--serve-before-ready",
                                         "--no-warmup-on-start")
                           ) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            with pytest.raises(WarmgateRpcError) as info:
                await collect(c, [1, 2, 3], regex="a+")
            [violation] = info.value.field_violations
            assert violation.subject == "sampling.regex"
            assert "end-of-sequence" in violation.description

    run(body(), 60)


def test_the_client_sends_at_most_one_grammar() -> None:
    request = generate_request([1], regex="a+")
    assert request.sampling.WhichOneof("structured") == "regex"
    with pytest.raises(ValueError, match="at most one of json_schema, regex and ebnf"):
        generate_request([1], regex="a+", ebnf='root ::= "a"')


def test_cli_generate_with_a_json_schema_file_and_a_regex(model_dir: Path,
                                                          tmp_path: Path) -> None:
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    with ServerThread(server_config("--model", str(model_dir))) as server:
        server.call(server.running.controller.warmup_kernels())
        server.call(grammar_probes_idle(server.running))
        out, err = io.StringIO(), io.StringIO()
        assert cli.main(["--target", server.target, "generate", "--prompt", "Hi",
                         "--max-tokens", "200", "--json-schema", str(schema_file)],
                        out=out, err=err) == 0, err.getvalue()
        assert _check_schema(out.getvalue().strip())
        out = io.StringIO()
        assert cli.main(["--target", server.target, "generate", "--prompt", "Hi",
                         "--max-tokens", "200", "--regex", REGEX], out=out, err=err) == 0
        assert re.fullmatch(REGEX, out.getvalue().strip())
        missing = tmp_path / "missing.gbnf"
        assert cli.main(["--target", server.target, "generate", "--prompt", "Hi",
                         "--grammar", str(missing)], out=out, err=err) == 4
        assert f"cannot read {missing}" in err.getvalue()
