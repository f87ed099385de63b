"""Overlapped scheduling (--async-scheduling) on the tiny model: step N+1 is launched before
step N's tokens are read, every request gets exactly the serial loop's tokens, and each step
that cannot overlap is counted by its reason."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tests.runner_helpers import make_runner, prompt
from tests.serving_helpers import Served, greedy
from warmgate.server.runner.scheduler_output import SamplingParams
from warmgate.server.serving.request import ServingRequest

EOS = 2


def serial_reasons(served: Served) -> Counter[str]:
    return Counter(s.serial_reason for s in served.stats if s.serial_reason is not None)


class CallOrder:
    """Records, in order, each forward the runner launches and each read of a launched
    step's tokens (the wait for the device), numbered by step."""

    def __init__(self, served: Served) -> None:
        self.calls: list[tuple[str, int]] = []
        runner = served.runner
        execute, sample = runner.execute_model, runner.sample_tokens_async

        def recording_execute(so: Any) -> Any:
            if so.num_scheduled_tokens:
                self.calls.append(("execute", self.num_executes()))
            return execute(so)

        def recording_sample(grammar_output: Any) -> Any:
            out = sample(grammar_output)
            step, get = self.num_executes() - 1, out.get

            def recording_get() -> Any:
                self.calls.append(("read", step))
                return get()

            out.get = recording_get
            return out

        runner.execute_model = recording_execute  # type: ignore[method-assign]
        runner.sample_tokens_async = recording_sample  # type: ignore[method-assign]

    def num_executes(self) -> int:
        return sum(1 for kind, _ in self.calls if kind == "execute")

    def index(self, call: tuple[str, int]) -> int:
        return self.calls.index(call)


def test_step_n_plus_1_is_launched_before_step_n_is_read() -> None:
    served = Served(make_runner(), async_scheduling=True)
    order = CallOrder(served)
    for i in range(3):
        served.submit(f"r{i}", prompt(6 + i, offset=i), greedy(10))
    served.run()
    num_steps = order.num_executes()
    assert num_steps == 10  # the prompts in one step, then a decode per token
    # The host never waited for a step before the next one was on the device: each read
    # comes after the following step's forward was launched (the last has none to follow).
    for step in range(num_steps - 1):
        assert order.index(("execute", step + 1)) < order.index(("read", step)), order.calls
    assert not serial_reasons(served)


def _outputs(served: Served, reqs: list[ServingRequest]) -> list[tuple[Any, ...]]:
    """Per request: its tokens, finish reason, and the logprobs its events carried."""
    return [(r.output_token_ids, r.finish_reason,
             [lp for e in served.events if e.req_id == r.req_id
              for lp in (*e.prompt_logprobs, *e.logprobs)]) for r in reqs]


def _grammar() -> Any:
    xgrammar = pytest.importorskip("xgrammar")
    del xgrammar
    from tests.text_helpers import train_tokenizer
    from warmgate.server.serving.grammar.backend import GrammarBackend
    from warmgate.server.serving.grammar.spec import GrammarSpec
    from warmgate.server.serving.grammar.tokenizer_info import tokenizer_info_of

    backend = GrammarBackend(tokenizer_info_of(train_tokenizer("byte_level"), 512, [EOS]))
    return backend.matcher(GrammarSpec("regex", "[a-z]{4,12}( [a-z]{2,9}){1,3}"))


def _mixed_run(async_scheduling: bool, *, num_spec: int, stop: int | None,
               with_grammar: bool) -> tuple[Served, list[ServingRequest]]:
    """Concurrent greedy, seeded, penalised and logprobs requests (and a grammar one) on a KV
    cache small enough to preempt, one greedy request stopping at `stop`."""
    served = Served(make_runner(num_spec=num_spec, num_blocks=24, max_num_seqs=6,
                                max_num_batched_tokens=32), async_scheduling=async_scheduling)
    specs = [
        greedy(14), greedy(12, stop=() if stop is None else (stop,)), greedy(16),
        SamplingParams(temperature=0.9, seed=7, max_tokens=13),
        SamplingParams(temperature=0.7, top_k=40, seed=11, max_tokens=15),
        SamplingParams(temperature=0.0, repetition_penalty=1.4, max_tokens=10),
        SamplingParams(temperature=0.0, logprobs=2, max_tokens=9),
        SamplingParams(temperature=0.0, prompt_logprobs=1, max_tokens=7),
    ]
    reqs = [served.submit(f"r{i}", prompt(5 + 3 * i, offset=i), p)
            for i, p in enumerate(specs)]
    if with_grammar:
        req = ServingRequest("g", prompt(7, offset=9), greedy(20), 0.0, grammar=_grammar())
        served.loop.submit(req)
        reqs.append(req)
    served.run()
    assert served.scheduler.pool.num_free == served.scheduler.pool.num_usable
    assert not served.runner.input_batch.requests
    return served, reqs


@pytest.mark.parametrize("num_spec", [0, 3])
@pytest.mark.parametrize("with_grammar", [False, True])
def test_async_tokens_equal_the_serial_loops(num_spec: int, with_grammar: bool) -> None:
    _, first = _mixed_run(False, num_spec=num_spec, stop=None, with_grammar=with_grammar)
    # A stop token the request meets mid-stream: the async loop has scheduled its next step
    # already and must throw that token away.
    stop = first[1].output_token_ids[5]
    serial, reqs = _mixed_run(False, num_spec=num_spec, stop=stop, with_grammar=with_grammar)
    overlapped, async_reqs = _mixed_run(True, num_spec=num_spec, stop=stop,
                                        with_grammar=with_grammar)
    assert _outputs(overlapped, async_reqs) == _outputs(serial, reqs)
    assert len(reqs[1].output_token_ids) <= 6
    assert serial.scheduler.num_preemptions > 0 and overlapped.scheduler.num_preemptions > 0
    assert not serial_reasons(serial)  # only counted with async scheduling
    reasons = serial_reasons(overlapped)
    # Every request has a drafter at k=3: that reason comes first whatever else applies.
    expected = ({"spec_decode"} if num_spec else
                {"preemption", "penalties", "logprobs"} | ({"grammar"} if with_grammar else set()))
    assert expected <= set(reasons), reasons
    # Some steps did overlap.
    assert sum(reasons.values()) < len(overlapped.stats)


def test_a_stopped_request_discards_the_step_launched_before_its_stop_was_read() -> None:
    first = Served(make_runner())
    probe = first.submit("a", prompt(6), greedy(12))
    first.run()
    stop = probe.output_token_ids[4]
    runs = {}
    for flag in (False, True):
        served = Served(make_runner(), async_scheduling=flag)
        reqs = [served.submit("a", prompt(6), greedy(12, stop=(stop,))),
                served.submit("b", prompt(9, offset=3), greedy(12))]
        served.run()
        steps_with_a = sum(1 for so in served.steps if "a" in so.num_scheduled_tokens)
        runs[flag] = ([(r.output_token_ids, r.finish_reason) for r in reqs], steps_with_a)
        assert not served.runner.input_batch.requests
    (serial_out, serial_steps), (async_out, async_steps) = runs[False], runs[True]
    assert async_out == serial_out
    assert serial_out[0][0][-1] == stop and len(serial_out[0][0]) <= 5
    # The prompt step and one per token, serially; the overlapped loop had launched one more
    # for "a" when it read the stop token, and that step's token never reached the stream.
    assert serial_steps == len(serial_out[0][0])
    assert async_steps == serial_steps + 1


PENALISED = SamplingParams(temperature=0.0, presence_penalty=2.0, frequency_penalty=1.0,
                           repetition_penalty=1.5, max_tokens=12)


@pytest.mark.parametrize(("reason", "params", "num_spec", "num_blocks"), [
    (None, greedy(12), 0, 128),
    (None, SamplingParams(temperature=0.8, seed=3, min_tokens=4, stop_token_ids=(EOS,),
                          logit_bias=((5, 4.0),), max_tokens=12), 0, 128),
    ("grammar", None, 0, 128),
    ("penalties", PENALISED, 0, 128),
    (None, SamplingParams(temperature=0.0, logprobs=3, max_tokens=12), 0, 128),
    ("logprobs", SamplingParams(temperature=0.0, prompt_logprobs=1, max_tokens=12), 0, 128),
    ("spec_decode", greedy(12), 3, 128),
    ("preemption", greedy(24), 0, 12),
])
def test_each_serial_reason_is_counted_and_tokens_stay_the_serial_loops(
        reason: str | None, params: SamplingParams | None, num_spec: int,
        num_blocks: int) -> None:
    from prometheus_client import CollectorRegistry

    from warmgate.server.serving.overlap import SERIAL_REASONS
    from warmgate.server.telemetry.serving_metrics import ServingMetrics

    outputs = {}
    for flag in (False, True):
        served = Served(make_runner(num_spec=num_spec, num_blocks=num_blocks),
                        async_scheduling=flag)
        reqs = []
        for i in range(3):
            if params is None:
                reqs.append(ServingRequest(f"r{i}", prompt(6, offset=i), greedy(12), 0.0,
                                           grammar=_grammar()))
                served.loop.submit(reqs[-1])
            else:
                reqs.append(served.submit(f"r{i}", prompt(6 + 4 * i, offset=i), params))
        served.run()
        outputs[flag] = _outputs(served, reqs)
    assert outputs[True] == outputs[False]
    assert all(out[0] for out in outputs[False])  # no request failed
    if params is not None and params.logprobs is not None:
        assert all(len(out[2]) == len(out[0]) for out in outputs[True])
    registry = CollectorRegistry()
    metrics = ServingMetrics(registry)
    for stats in served.stats:
        metrics.observe_step(stats)
    counted = {r: registry.get_sample_value("warmgate_serial_steps_total", {"reason": r})
               for r in SERIAL_REASONS}
    assert {r for r, n in counted.items() if n} == ({reason} if reason else set()), counted
    if reason == "preemption":
        assert served.scheduler.num_preemptions > 0


def test_a_real_server_streams_the_same_tokens_with_and_without_the_flag() -> None:
    """--async-scheduling (the default) and --no-async-scheduling reach the serving loop, and
    concurrent greedy and seeded streams through Generate get the same tokens."""
    import asyncio

    from tests.grpc_harness import run, server_config, serving
    from tests.test_grpc_generate import collect
    from warmgate.client.aio import AsyncWarmgateClient

    got: dict[bool, list[list[int]]] = {}

    async def body(flags: tuple[str, ...], expect: bool) -> None:
        config = server_config("--max-num-batched-tokens", "32", *flags)
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            kinds = [{}, {"temperature": 0.8, "seed": 5}] * 3
            gens = await asyncio.gather(*(
                collect(c, prompt(5 + 6 * i, offset=i), max_tokens=10, **kw)
                for i, kw in enumerate(kinds)))
            loop = s.generation.serving_loop
            assert loop is not None and loop.async_scheduling is expect
            got[expect] = [g.token_ids for g in gens]

    run(body((), True), 120)
    run(body(("--no-async-scheduling",), False), 120)
    assert got[True] == got[False]
    assert all(len(tokens) == 10 for tokens in got[True])


def test_tensor_parallel_steps_run_serially_and_give_the_same_tokens() -> None:
    """At TP > 1 the workers get rank 0's tokens with the next call, so every step is sampled
    on the host: counted as tensor_parallel, tokens unchanged."""
    from tests.runner_helpers import tiny_config
    from tests.tp_helpers import tp_runner
    from warmgate.server.runner.model_runner import ModelRunner

    config = tiny_config(max_num_batched_tokens=32)
    prompts = [prompt(n, offset=n) for n in (5, 40, 9)]

    def serve(runner: ModelRunner, flag: bool) -> tuple[list[list[int]], Counter[str]]:
        served = Served(runner, async_scheduling=flag)
        reqs = [served.submit(f"r{i}", p, greedy(10)) for i, p in enumerate(prompts)]
        served.run()
        return [list(r.output_token_ids) for r in reqs], serial_reasons(served)

    expected, _ = serve(ModelRunner(config), False)
    with tp_runner(config, 2) as runner:
        tokens, reasons = serve(runner, True)
    assert tokens == expected
    assert set(reasons) == {"tensor_parallel"}


def test_host_step_bench_prints_the_serial_and_the_overlapped_loop_side_by_side() -> None:
    from tests.bench_harness import run_bench

    out = run_bench("bench/serve.py host-step", [
        "--overlap", "--streams", "4", "--prompt-len", "8", "--warm-steps", "1", "--steps", "4",
        "--max-num-seqs", "8", "--max-model-len", "64", "--max-num-batched-tokens", "64"])
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()
            if line.split() and line.split()[0] in ("serial", "async")}
    assert set(rows) == {"serial", "async"}
    # Nine numbers (the parts, the step, host) and the tokens' hash, the same in both loops.
    assert all(len(r) == 11 for r in rows.values()) and rows["serial"][-1] == rows["async"][-1]
    assert "async / serial" in out.stdout and "tokens equal" in out.stdout
