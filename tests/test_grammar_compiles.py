"""Grammar compiles on their own: the no-string analysis of xgrammar's grammars, the schema
keywords xgrammar does not enforce, the byte-bounded cache, the probe processes (budget, kill
on cancel, one compile per spec, concurrent requests sharing it, close), a dead end met
mid-output, and compact JSON by default."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import psutil
import pytest
import torch
import xgrammar as xgr
from tokenizers import Tokenizer

from tests.text_helpers import train_tokenizer
from warmgate.server.core.errors import ShuttingDown
from warmgate.server.serving.grammar.backend import GrammarBackend
from warmgate.server.serving.grammar.byte_cache import RSS_PER_REPORTED_BYTE, ByteBoundedCache
from warmgate.server.serving.grammar.compiles import (
    COMPILE_OUTCOMES,
    CompileLimits,
    GrammarCompiles,
)
from warmgate.server.serving.grammar.emptiness import admits_no_string
from warmgate.server.serving.grammar.front_end import parse
from warmgate.server.serving.grammar.local_builds import LocalBuilds
from warmgate.server.serving.grammar.matcher import RequestGrammar
from warmgate.server.serving.grammar.probe_pool import ProbeTimeout
from warmgate.server.serving.grammar.schema_checks import unenforced_schema_reason
from warmgate.server.serving.grammar.spec import (
    GrammarDeadEnd,
    GrammarError,
    GrammarSpec,
    GrammarTimeout,
)
from warmgate.server.telemetry.serving_metrics import GRAMMAR_COMPILE_OUTCOMES

VOCAB = 512
EOS = 2
# Seconds to compile on the trained tokenizer's vocabulary: about 8 (the 12 KB schema of
# 150 patterned properties, with a pattern longer than the issue's).
HEAVY_PATTERN = "([a-z]{1,40}[0-9]{1,40}){1,30}"
NO_STRING = r"[^\s\S]"


def patterned_schema(num: int = 150, pattern: str = HEAVY_PATTERN, salt: str = "") -> str:
    names = [f"p{salt}{i}" for i in range(num)]
    return json.dumps({"type": "object", "required": names, "properties": {
        n: {"type": "string", "pattern": pattern} for n in names}})


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_tokenizer("byte_level")


@pytest.fixture(scope="module")
def backend(tokenizer: Tokenizer) -> GrammarBackend:
    from warmgate.server.serving.grammar.tokenizer_info import tokenizer_info_of

    return GrammarBackend(tokenizer_info_of(tokenizer, VOCAB, [EOS]))


@pytest.mark.parametrize(("grammar", "empty"), [
    (lambda: xgr.Grammar.from_regex(NO_STRING), True),
    (lambda: xgr.Grammar.from_ebnf("root ::= a\na ::= a"), True),
    (lambda: xgr.Grammar.from_ebnf('root ::= "x" a\na ::= a "y"'), True),
    (lambda: xgr.Grammar.from_regex(r"(a[^\s\S])+"), True),
    (lambda: xgr.Grammar.from_json_schema(json.dumps({"type": "string",
                                                      "pattern": NO_STRING})), True),
    (lambda: xgr.Grammar.from_json_schema(json.dumps(
        {"type": "object", "properties": {"a": {"type": "string", "pattern": NO_STRING}},
         "required": ["a"]})), True),
    # Optional, the empty property is never written: the schema admits "{}".
    (lambda: xgr.Grammar.from_json_schema(json.dumps(
        {"type": "object", "properties": {"a": {"type": "string", "pattern": NO_STRING}}})),
     False),
    (lambda: xgr.Grammar.from_ebnf('root ::= "x" a\na ::= a "y" | "z"'), False),
    (lambda: xgr.Grammar.from_regex(r"(a[^\s\S])|b"), False),
    (lambda: xgr.Grammar.from_regex("a{2,5}b?"), False),
    (lambda: xgr.Grammar.from_regex("[^a]"), False),
    (lambda: xgr.Grammar.from_regex(""), False),
    (lambda: xgr.Grammar.builtin_json_grammar(), False),
])
def test_grammars_that_admit_no_string_are_found(grammar: Callable[[], xgr.Grammar],
                                                 empty: bool) -> None:
    assert admits_no_string(grammar().serialize_json()) is empty


@pytest.mark.parametrize(("schema", "words"), [
    ({"allOf": [{"type": "string"}, {"type": "integer"}]},
     "allOf at / is unsatisfiable: no value has all of the types integer and string"),
    ({"properties": {"x": {"allOf": [{"type": "number"}, {"minimum": 3}]}}},
     "allOf at /properties/x has 2 subschemas"),
    ({"items": {"not": {"type": "string"}}}, "'not' at /items is not enforced"),
    ({"allOf": [{"type": "integer"}]}, None),
    ({"properties": {"allOf": {"type": "string"}, "not": {}}}, None),  # property names
    ({"allOf": [{"type": ["string", "null"]}, {"type": "null"}]},
     "allOf at / has 2 subschemas"),
])
def test_schema_keywords_xgrammar_does_not_enforce_are_named(schema: dict[str, Any],
                                                             words: str | None) -> None:
    reason = unenforced_schema_reason(json.dumps(schema))
    assert reason == words if words is None else words in (reason or "")


def test_the_cache_is_bounded_by_bytes_least_recently_used_first() -> None:
    charged = ByteBoundedCache.charge(40)
    assert charged == int(40 * RSS_PER_REPORTED_BYTE)  # what RSS grows by, not xgrammar's
    cache: ByteBoundedCache[str, str] = ByteBoundedCache(2 * charged + 10)
    assert cache.put("a", "A", 40) and cache.put("b", "B", 40)
    assert cache.get("a") == "A"  # a is now the most recently used
    assert cache.put("c", "C", 40)
    assert cache.get("b") is None and cache.get("a") == "A" and cache.get("c") == "C"
    assert cache.num_bytes == 2 * charged and len(cache) == 2
    assert not cache.put("huge", "H", 200)  # alone over the budget: not kept, nothing dropped
    assert len(cache) == 2 and cache.get("huge") is None


def test_compact_json_by_default_free_whitespace_on_request(backend: GrammarBackend) -> None:
    schema = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}},
                         "required": ["a"]})

    def accepts(spec: GrammarSpec, text: str) -> bool:
        compiled = xgr.GrammarCompiler(backend.tokenizer_info).compile_grammar(parse(spec))
        return bool(xgr.GrammarMatcher(compiled).accept_string(text))

    compact = GrammarSpec("json_schema", schema)
    assert accepts(compact, '{"a": 1}')  # json.dumps's separators
    assert not accepts(compact, '{\n  "a": 1')
    assert not accepts(compact, '{"a":  1')
    assert accepts(GrammarSpec("json_schema", schema, json_whitespace=True), '{\n  "a":  1')


def _metered(backend: GrammarBackend, timeout_s: float, cache_mib: int = 64
             ) -> tuple[GrammarCompiles, list[tuple[str, float]]]:
    seen: list[tuple[str, float]] = []
    compiles = GrammarCompiles(backend.tokenizer_info.serialize_json(), backend.compile_threads,
                               CompileLimits(timeout_s, 2, cache_mib << 20),
                               LocalBuilds(backend, cache_mib << 20, 2),
                               lambda outcome, s: seen.append((outcome, s)))
    return compiles, seen


async def _matcher(compiles: GrammarCompiles, spec: GrammarSpec) -> RequestGrammar:
    grammar = await compiles.prepare(spec, "req")
    assert grammar is not None  # built in this process
    return grammar


async def _probes_idle(compiles: GrammarCompiles, timeout_s: float = 90.0) -> None:
    """Every probe process started and idle (a start, seconds on a loaded machine, counts
    against a request's budget)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while compiles.pool.num_idle < 2:
        assert loop.time() < deadline, "the probe processes did not start"
        await asyncio.sleep(0.05)


def test_one_compile_per_grammar_shared_by_concurrent_requests(backend: GrammarBackend
                                                               ) -> None:
    async def body() -> None:
        compiles, seen = _metered(backend, 60.0)
        compiles.start()
        try:
            schema = GrammarSpec("json_schema", patterned_schema(20, "[a-z]{1,5}"))
            matchers = await asyncio.gather(*(_matcher(compiles, schema) for _ in range(12)))
            assert len({id(m.matcher) for m in matchers}) == 12  # a matcher per request
            await _matcher(compiles, schema)  # later: from the cache
            assert [o for o, _ in seen] == ["compiled"]
            # The same text under another kind or whitespace rule is another grammar.
            await _matcher(compiles, GrammarSpec("json_schema", schema.text,
                                               json_whitespace=True))
            assert [o for o, _ in seen] == ["compiled", "compiled"]
            for spec in (GrammarSpec("regex", NO_STRING),
                         GrammarSpec("ebnf", "root ::= a\na ::= a"),
                         GrammarSpec("json_schema", json.dumps(
                             {"type": "string", "pattern": NO_STRING}))):
                with pytest.raises(GrammarError, match="admits no string at all") as info:
                    await _matcher(compiles, spec)
                assert info.value.field == spec.field
            assert compiles.pool.num_killed == 0
        finally:
            compiles.close()
            await compiles.wait_closed()

    asyncio.run(asyncio.wait_for(body(), 120))


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _dead(pids: list[int]) -> int:
    return sum(_ended(pid) for pid in pids)


async def _one_more_dead(pids: list[int], count: int) -> None:
    """The probe process stopped (killed: it had seconds of compile left)."""
    for _ in range(50):
        if _dead(pids) == count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{_dead(pids)} probe processes ended, not {count}")


def test_past_the_budget_or_when_nobody_waits_the_probe_is_killed(backend: GrammarBackend
                                                                  ) -> None:
    async def body() -> None:
        compiles, seen = _metered(backend, 1.0)
        compiles.start()
        await _probes_idle(compiles)
        try:
            loop = asyncio.get_running_loop()
            start = loop.time()
            probes = compiles.pool.pids
            with pytest.raises(GrammarTimeout, match=r"sampling\.json_schema: not compiled "
                                                     r"within the server's 1 s"):
                await _matcher(compiles, GrammarSpec("json_schema", patterned_schema()))
            assert loop.time() - start < 1.0 + 0.5
            assert seen[-1][0] == "timeout"
            await _one_more_dead(probes, 1)
            # Every waiting request cancelled: the compile stops with them.
            await _probes_idle(compiles)
            probes = compiles.pool.pids
            spec = GrammarSpec("json_schema", patterned_schema(salt="x"))
            waiting = [asyncio.ensure_future(_matcher(compiles, spec)) for _ in range(2)]
            await asyncio.sleep(0.2)
            waiting[0].cancel()
            await asyncio.sleep(0.2)
            assert _dead(probes) == 0  # one still waits
            waiting[1].cancel()
            await _one_more_dead(probes, 1)
            assert seen[-1][0] == "cancelled"
            # Shutdown kills a compile in progress; its request is told so.
            await _probes_idle(compiles)
            pending = asyncio.ensure_future(_matcher(compiles,
                GrammarSpec("json_schema", patterned_schema(salt="y"))))
            await asyncio.sleep(0.3)
            compiles.close()
            with pytest.raises(ShuttingDown):
                await pending
        finally:
            compiles.close()
            await compiles.wait_closed()

    asyncio.run(asyncio.wait_for(body(), 120))


def test_a_dead_end_mid_output_is_named_not_a_violation(backend: GrammarBackend,
                                                        tokenizer: Tokenizer) -> None:
    a = tokenizer.token_to_id("a")
    grammar = backend.matcher(GrammarSpec("regex", r"a[^\s\S]|b"))
    assert not grammar.is_dead_end()
    assert not grammar.accept(a)
    assert grammar.is_dead_end()
    rows = torch.zeros((2, grammar.bitmask_width), dtype=torch.int32)
    grammar.fill_rows(rows, 0, [a])
    assert (rows == -1).all()  # never all -inf for the sampler
    with pytest.raises(GrammarDeadEnd) as info:
        grammar.accept(5)
    assert info.value.field == "sampling.regex"
    assert "allows no token after the 1 tokens produced" in info.value.message
    # With a draft into the dead end: the row before it is the grammar's, the rest open.
    fresh = backend.matcher(GrammarSpec("regex", r"a[^\s\S]|b"))
    rows = torch.zeros((3, fresh.bitmask_width), dtype=torch.int32)
    fresh.fill_rows(rows, 0, [a, a])
    assert rows[0].any() and not (rows[0] == -1).all() and (rows[1:] == -1).all()


def test_the_metric_outcomes_are_the_compiles() -> None:
    assert GRAMMAR_COMPILE_OUTCOMES == COMPILE_OUTCOMES


def test_a_probe_whose_time_ran_out_before_it_started_is_not_left_busy(
        backend: GrammarBackend) -> None:
    """No time left by the time a probe is taken (a request that waited out its budget for
    a slot): the probe used to be taken and never given back, and after two of those every
    grammar failed 'no grammar compile probe is free to start'."""
    async def body() -> None:
        compiles, _ = _metered(backend, 60.0)
        compiles.start()
        try:
            await _probes_idle(compiles)
            pool = compiles.pool
            for _ in range(3):
                with pytest.raises(ProbeTimeout):
                    await pool.probe(GrammarSpec("json_schema", patterned_schema()), 0.0)
                assert pool.num_busy == 0
            await _probes_idle(compiles)
            verdict = await pool.probe(GrammarSpec("regex", "(yes|no)"), 30.0)
            assert verdict.ok and pool.num_busy == 0
        finally:
            compiles.close()
            await compiles.wait_closed()

    asyncio.run(asyncio.wait_for(body(), 120))
