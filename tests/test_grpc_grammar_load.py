"""Grammar requests under load, against a live server (the tiny model with a trained
tokenizer): bursts of concurrent schemas past the compile budget fail alone and leave the
next grammar compiling; a plain request beside 16 grammar requests keeps its latency with the
engine process on; no grammar request takes longer than the compile budget before its first
token, the build after its probe included."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import grpc
import pytest
import xgrammar as xgr
from tokenizers import Tokenizer

from tests.grpc_harness import grammar_probes_idle, run, server_config, serving
from tests.test_grammar_compiles import HEAVY_PATTERN, VOCAB, patterned_schema
from tests.test_grpc_grammar_limits import _error_of
from tests.test_grpc_structured import EOS
from tests.test_grpc_text import collect
from tests.text_helpers import write_tiny_model
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.errors import WarmgateRpcError
from warmgate.server.serving.grammar.tokenizer_info import tokenizer_info_of

BUDGET_S = 1.0
# Before a grammar's first token: its compile budget, then this for the step and transport
# (a step of the tiny model takes milliseconds).
FIRST_TOKEN_SLACK_S = 0.5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-grammar-load"), eos_token_id=EOS)


def test_bursts_of_over_budget_schemas_fail_alone_and_a_new_grammar_compiles_after(
        model_dir: Path) -> None:
    config = server_config("--model", str(model_dir), "--grammar-compile-timeout",
                           str(BUDGET_S))

    async def body() -> None:
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            await grammar_probes_idle(s)
            for burst in range(5):
                # About 8 s each on this vocabulary, over a 1 s budget: 4 at once against 2
                # compile slots, so two wait out a slot and find no time left.
                failed = await asyncio.gather(*(
                    _error_of(c, json_schema=patterned_schema(salt=f"{burst}-{i}"),
                              max_tokens=4) for i in range(4)))
                for error, tokens in failed:
                    assert error.code is grpc.StatusCode.RESOURCE_EXHAUSTED, error
                    assert tokens == 0
            # At once, without waiting for the probes: a small new grammar compiles and serves.
            got, _ = await collect(c, [1, 2, 3], regex="(yes|no)!", max_tokens=8)
            assert got.finish_reason == "stop" and got.text in ("yes!", "no!"), got
            # The killed probes' replacements start in the background (a process each, slow
            # on a loaded machine): every one comes back.
            await grammar_probes_idle(s)

    run(body(), 180)


def test_a_plain_request_beside_sixteen_grammar_requests_keeps_its_latency(
        model_dir: Path) -> None:
    config = server_config("--model", str(model_dir), "--engine-process")

    async def plain(c: AsyncWarmgateClient) -> float:
        sent = time.monotonic()
        got, _ = await collect(c, [1, 2, 3], max_tokens=2, ignore_eos=True)
        assert len(got.token_ids) == 2
        return time.monotonic() - sent

    async def body() -> None:
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            await grammar_probes_idle(s)
            await collect(c, [1, 2, 3], regex="(yes|no)", max_tokens=4)  # compiled, cached
            alone = statistics.median([await plain(c) for _ in range(5)])
            grammars = [asyncio.ensure_future(collect(c, [4, 5, 6 + i], regex="(yes|no)",
                                                      max_tokens=4)) for i in range(16)]
            await asyncio.sleep(0)  # the grammar requests are on their way first
            beside = await plain(c)
            done = await asyncio.gather(*grammars)
            print(f"plain request alone {alone:.3f} s, beside 16 grammar requests "
                  f"{beside:.3f} s")
            assert all(got.text in ("yes", "no") for got, _ in done)
            assert beside <= 2 * alone + 0.5, (alone, beside)

    run(body(), 180)


async def _first_token_or_error(c: AsyncWarmgateClient, schema: str
                                ) -> tuple[float, WarmgateRpcError | None]:
    """Seconds from sending to the first token (or to the error the stream ended with)."""
    sent = time.monotonic()
    try:
        async for message in c.generate([1, 2, 3], json_schema=schema, max_tokens=4):
            if message.token_ids:
                return time.monotonic() - sent, None
    except WarmgateRpcError as exc:
        return time.monotonic() - sent, exc
    raise AssertionError("the stream ended without a token or an error")


def _seconds_per_property(model_dir: Path) -> float:
    """What one patterned property costs to compile on this machine now (the probes compile
    as this does: the same vocabulary, two threads)."""
    compiler = xgr.GrammarCompiler(tokenizer_info_of(
        Tokenizer.from_file(str(model_dir / "tokenizer.json")), VOCAB, [EOS]),
        max_threads=2, cache_enabled=False)
    num = 10
    start = time.perf_counter()
    compiler.compile_grammar(xgr.Grammar.from_json_schema(
        patterned_schema(num, HEAVY_PATTERN, salt="calibrate"), any_whitespace=False))
    return (time.perf_counter() - start) / num


def test_no_grammar_request_takes_longer_than_its_budget_before_its_first_token(
        model_dir: Path) -> None:
    """Schemas whose compile takes from a small part of a 3 s budget to nearly all of it,
    with the engine process (the default) building what the probes accept: each gets its
    first token or RESOURCE_EXHAUSTED within the budget. A grammar compiles twice (probe,
    then build), so one its probe accepted late used to come about twice its compile after
    it was asked for."""
    budget = 3.0
    config = server_config("--model", str(model_dir), "--engine-process",
                           "--grammar-compile-timeout", str(budget))

    async def body() -> None:
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            await grammar_probes_idle(s)
            per_property = _seconds_per_property(model_dir)
            sizes = [2, *(max(3, round(share * budget / per_property))
                          for share in (0.6, 0.75, 0.9))]
            results = []
            for n in sizes:  # one at a time: the compile takes what was measured
                results.append(await _first_token_or_error(
                    c, patterned_schema(n, HEAVY_PATTERN, salt=f"e{n}")))
            print("\n".join(f"{n} properties: {seconds:.2f} s, "
                            f"{'first token' if error is None else error.code.name}"
                            for n, (seconds, error) in zip(sizes, results, strict=True)))
            for seconds, error in results:
                assert error is None or error.code is grpc.StatusCode.RESOURCE_EXHAUSTED, error
                assert seconds <= budget + FIRST_TOKEN_SLACK_S, results
            assert results[0][1] is None  # the small one compiles

    run(body(), 180)
