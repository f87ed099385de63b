"""The Generate RPC end to end: a real server on the tiny model (CPU), real clients."""

from __future__ import annotations

import asyncio
import dataclasses
import io

import grpc
import pytest

from tests.grpc_harness import ServerThread, eventually, run, server_config, serving
from tests.runner_helpers import prompt
from tests.serving_helpers import reference_greedy
from warmgate.client import cli
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.errors import WarmgateRpcError
from warmgate.client.generate import Generation
from warmgate.server.app import RunningServer, create_server
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.serving.loop import STEP_KINDS
from warmgate.v1 import generate_pb2 as gen_pb

SERVING = 1  # grpc.health.v1 SERVING


async def collect(client: AsyncWarmgateClient, prompt_ids: list[int], **kw: object
                  ) -> Generation:
    result = Generation()
    async for message in client.generate(prompt_ids, **kw):  # type: ignore[arg-type]
        result.add(message)
    return result


def blocks_all_free(s: RunningServer) -> bool:
    loop = s.generation.serving_loop
    assert loop is not None
    pool = loop.scheduler.pool
    return pool.num_free == pool.num_usable and not loop.runner.input_batch.requests


# The runner in this process, and in an engine process of its own (--engine-process).
ENGINE = pytest.mark.parametrize("engine", ["--no-engine-process", "--engine-process"])


def _steps(s: RunningServer) -> float:
    """Serving steps so far, wherever the loop runs."""
    return sum(s.metrics.registry.get_sample_value("warmgate_step_duration_seconds_count",
                                                   {"kind": kind}) or 0.0
               for kind in STEP_KINDS)


@ENGINE
def test_generate_is_unavailable_until_ready_then_matches_the_reference_loop(
        engine: str) -> None:
    config = server_config("--max-num-batched-tokens", "32", engine)

    async def body() -> None:
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            with pytest.raises(WarmgateRpcError) as info:
                await collect(c, [1, 2, 3])
            assert info.value.code is grpc.StatusCode.UNAVAILABLE
            assert "warmup state" in info.value.message
            await c.warmup_kernels()
            p = prompt(40)  # longer than the 32-token budget: a chunked prefill
            got = await collect(c, p, max_tokens=12)
            assert got.finish_reason == "length" and got.usage is not None
            assert got.usage.completion_tokens == 12 and got.usage.prompt_tokens == 40
            assert got.token_times_s == sorted(got.token_times_s)
            # The first message carries the first token, or (a reader slower than the steps)
            # it and the ones after it, stamped when the last of them was ready.
            assert 0 < got.usage.time_to_first_token_s <= got.token_times_s[0] + 1e-6
            # Same preset and seeded weights; a budget that takes the prompt in one step.
            wide = dataclasses.replace(config.runner, scheduler=dataclasses.replace(
                config.runner.scheduler, max_num_batched_tokens=64))
            assert got.token_ids == reference_greedy(ModelRunner(wide), p, 12)

    run(body(), 120)


def test_serve_before_ready_answers_before_any_warmup() -> None:
    async def body() -> None:
        async with serving(server_config("--serve-before-ready")) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await eventually(lambda: s.controller.model_loaded, 60)
            got = await collect(c, [3, 1, 4, 1, 5], max_tokens=4)
            assert len(got.token_ids) == 4
            assert await c.health() != SERVING  # still not ready: no warmup ran

    run(body(), 120)


def test_the_serving_loop_is_built_before_health_turns_serving(
        caplog: pytest.LogCaptureFixture) -> None:
    """Its block pool (one entry per KV block, 30k+ on a large GPU) is not the first
    request's cost; a failing ready listener is logged and readiness goes on."""

    def broken() -> None:
        raise RuntimeError("listener bug")

    async def body() -> None:
        async with serving(server_config()) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            s.controller.add_ready_listener(broken)
            assert s.generation.serving_loop is None  # loaded, not warmed: nothing built yet
            await c.warmup_kernels()
            assert await c.health() == SERVING
            loop = s.generation.serving_loop
            assert loop is not None and loop.num_steps > 0  # the serving rehearsal's steps
            num_blocks = loop.runner.config.cache.num_blocks  # the runner's resolved cache
            assert loop.scheduler.pool.num_free == num_blocks - 1  # all but the null block
            got = await collect(c, [5, 6, 7], max_tokens=3)
            assert len(got.token_ids) == 3 and s.generation.serving_loop is loop

    run(body(), 120)
    assert "a ready listener failed" in caplog.text


def test_32_concurrent_streams_all_finish_and_free_every_block() -> None:
    async def body() -> None:
        async with serving(server_config("--num-speculative-steps", "3", "--max-model-len",
                                         "256")) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            results = await asyncio.gather(*[
                collect(c, prompt(4 + i % 9, offset=i), max_tokens=10 + i % 5,
                        temperature=0.0 if i % 2 else 0.8, seed=i)
                for i in range(32)])
            for i, got in enumerate(results):
                assert got.finish_reason == "length"
                assert len(got.token_ids) == 10 + i % 5
            # The runner drops the last request's state at the step after its final token.
            await eventually(lambda: blocks_all_free(s), 10)
            drafts = sum(r.usage.num_draft_tokens for r in results if r.usage)
            assert drafts > 0  # k=3: every decode step verified drafts

    run(body(), 180)


def test_a_cancelled_stream_frees_its_blocks_and_the_server_keeps_serving() -> None:
    async def body() -> None:
        async with serving(server_config("--max-model-len", "512")) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            stream = c.generate(prompt(20), max_tokens=400)
            for _ in range(3):
                await stream.__anext__()
            loop = s.generation.serving_loop
            assert loop is not None and loop.scheduler.num_blocks_used > 0
            await stream.aclose()  # cancels the call
            await eventually(lambda: blocks_all_free(s), 30)
            # A cancel is CANCELLED in the metrics, not an internal error.
            await eventually(lambda: s.metrics.registry.get_sample_value(
                "warmgate_rpc_requests_total", {"method": "/warmgate.v1.Generation/Generate",
                                                "code": "CANCELLED"}) == 1, 10)
            got = await collect(c, [9, 9, 9], max_tokens=3)
            assert len(got.token_ids) == 3

    run(body(), 120)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"prompt_token_ids": []}, "prompt_token_ids"),
    ({"prompt_token_ids": [1, 10**6]}, "prompt_token_ids[1]"),
    ({"temperature": -1.0}, "sampling.temperature"),
    ({"top_p": 0.0}, "sampling.top_p"),
    ({"top_k": -2}, "sampling.top_k"),
    ({"max_tokens": 0}, "sampling.max_tokens"),
    ({"max_tokens": 10**6}, "sampling.max_tokens"),
    ({"stop_token_ids": [-1]}, "sampling.stop_token_ids[0]"),
])
def test_bad_generate_requests_name_the_field_and_lose_nothing(kwargs: dict[str, object],
                                                               field: str) -> None:
    ids = kwargs.pop("prompt_token_ids", [1, 2, 3])

    async def body() -> None:
        async with serving(server_config("--num-blocks", "20")) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            with pytest.raises(WarmgateRpcError) as info:
                await collect(c, ids, **kwargs)  # type: ignore[arg-type]
            assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
            assert [v.subject for v in info.value.field_violations] == [field]
            assert len((await collect(c, [1, 2], max_tokens=2)).token_ids) == 2

    run(body(), 120)


@ENGINE
def test_a_forced_warmup_during_streams_pauses_them_and_they_finish_unchanged(
        engine: str) -> None:
    config = server_config(engine)

    async def body() -> None:
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            before = _steps(s)  # the serving rehearsal's
            prompts = [prompt(6 + i, offset=i) for i in range(4)]
            streams = [asyncio.ensure_future(collect(c, p, max_tokens=40)) for p in prompts]
            await eventually(lambda: _steps(s) > before + 3, 30)
            report = await c.warmup_kernels(force=True)
            results = await asyncio.gather(*streams)
            assert report.outcome == 1  # SUCCEEDED, with the streams' requests preempted
            reference = ModelRunner(config.runner)
            for p, got in zip(prompts, results, strict=True):
                assert got.token_ids == reference_greedy(reference, p, 40)
            assert sum(r.usage.num_preemptions for r in results if r.usage) > 0

    run(body(), 180)


def test_generate_metrics_count_requests_tokens_and_first_token_time() -> None:
    async def body() -> None:
        async with serving(server_config()) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            await collect(c, [1, 2, 3], max_tokens=5)
            reg = s.metrics.registry
            assert reg.get_sample_value("warmgate_generate_requests_total",
                                        {"finish_reason": "length"}) == 1
            assert reg.get_sample_value("warmgate_generated_tokens_total") == 5
            assert reg.get_sample_value("warmgate_time_to_first_token_seconds_count") == 1
            assert reg.get_sample_value("warmgate_rpc_requests_total", {
                "method": "/warmgate.v1.Generation/Generate", "code": "OK"}) == 1

    run(body(), 120)


def test_cli_generate_prints_ids_and_json() -> None:
    with ServerThread(server_config()) as server:
        server.call(server.running.controller.warmup_kernels())
        out, err = io.StringIO(), io.StringIO()
        code = cli.main(["--target", server.target, "generate", "--prompt-ids", "1,2,3",
                         "--max-tokens", "4"], out=out, err=err)
        assert code == 0
        ids = [int(t) for t in out.getvalue().strip().split(",")]
        assert len(ids) == 4 and "4 tokens, finish length" in err.getvalue()
        out = io.StringIO()
        assert cli.main(["--target", server.target, "--json", "generate", "--prompt-ids",
                         "1, 2, 3", "--max-tokens", "4"], out=out, err=err) == 0
        assert '"token_ids": [' + ", ".join(map(str, ids)) + "]" in out.getvalue()
        # What only the server can judge (the model's vocabulary) is an RPC error naming the
        # field; a value out of any range (`--max-tokens 0`) is the CLI's own usage error.
        assert cli.main(["--target", server.target, "generate", "--prompt-ids", "1,99999999",
                         "--max-tokens", "4"], out=out, err=err) == cli.EXIT_RPC_ERROR
        assert "prompt_token_ids[1]" in err.getvalue()


def test_finish_reasons_map_to_the_proto_enum() -> None:
    # The server's finish reasons and the proto's enum must not drift apart.
    from warmgate.server.api.generation import _FINISH
    from warmgate.server.serving.request import FinishReason

    assert set(_FINISH) == {r.value for r in FinishReason}
    assert gen_pb.FinishReason.Name(_FINISH["stop"]) == "FINISH_REASON_STOP"


def test_shutdown_lets_open_streams_finish_within_the_grace_and_refuses_new_ones() -> None:
    async def body() -> None:
        s = await create_server(server_config())
        try:
            async with AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
                await c.warmup_kernels()
                loop = s.generation.serving_loop
                assert loop is not None
                before = loop.num_steps  # the serving rehearsal's
                stream = asyncio.ensure_future(collect(c, prompt(8), max_tokens=60))
                await eventually(lambda: loop.num_steps > before + 2, 30)
                stopping = asyncio.ensure_future(s.stop(10.0, wait_for_runner=True))
                await eventually(lambda: s.generation._closing, 10)
                with pytest.raises(WarmgateRpcError) as info:
                    await collect(c, [1, 2], max_tokens=2)
                assert info.value.code is grpc.StatusCode.UNAVAILABLE
                got = await stream
                assert len(got.token_ids) == 60 and got.finish_reason == "length"
                await stopping
        finally:
            await s.stop(0)

    run(body(), 120)
