"""The engine process (--engine-process): the runner, warmup and serving loop in a child
process of the server, and every contract the in-process server keeps, kept through it."""

from __future__ import annotations

import asyncio
import os
import pickle
import re
import signal
import statistics
import time
import urllib.request

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.grpc_harness import eventually, run, server_config, serving
from tests.runner_helpers import prompt
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.api import WaitResult, WarmgateClient
from warmgate.client.errors import WarmgateRpcError
from warmgate.client.generate import generate_request
from warmgate.server.api.generation import _stream_error
from warmgate.server.control.engine_wire import (
    events_of_wire,
    events_to_wire,
    failure_of_wire,
    failure_to_wire,
)
from warmgate.server.core.errors import InvalidArgument, ResourceExhausted, ShuttingDown
from warmgate.server.core.failures import FatalDeviceError
from warmgate.server.devtools.server_process import ServerProcess
from warmgate.server.runner.scheduler_output import TokenLogprobs
from warmgate.server.serving.grammar.spec import GrammarDeadEnd, GrammarViolation
from warmgate.server.serving.request import FinishReason, StepEvent, Usage
from warmgate.v1 import generate_pb2_grpc as gen_grpc
from warmgate.v1 import warmup_pb2 as pb

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVING = health_pb2.HealthCheckResponse.SERVING
ENGINE_PID = re.compile(r"engine process started \(pid (\d+)\)")
NUM_STREAMS = 8


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting for its parent."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def _greedy_streams(flags: tuple[str, ...]) -> tuple[list[list[int]], int | None]:
    """NUM_STREAMS concurrent greedy streams of different prompts and lengths; the tokens
    and the engine process's pid (None in one process)."""
    async with serving(server_config(*flags)) as s, \
            AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
        await c.warmup_kernels()
        pid = s.engine_process.process.pid if s.engine_process is not None else None

        async def one(i: int) -> list[int]:
            return [t async for m in c.generate(prompt(3 + 5 * i, offset=7 * i),
                                                max_tokens=12 + 3 * i, ignore_eos=True)
                    for t in m.token_ids]

        return list(await asyncio.gather(*[one(i) for i in range(NUM_STREAMS)])), pid


@pytest.mark.parametrize("k", [0, 3])
def test_greedy_tokens_through_the_engine_process_equal_the_in_process_loop(k: int) -> None:
    flags = ("--num-speculative-steps", str(k), "--max-model-len", "256")

    async def body() -> None:
        serial, no_pid = await _greedy_streams(flags)
        remote, pid = await _greedy_streams((*flags, "--engine-process"))
        assert no_pid is None and pid is not None
        assert [len(t) for t in remote] == [12 + 3 * i for i in range(NUM_STREAMS)]
        assert remote == serial
        await eventually(lambda: not _alive(pid), 10)  # stop() ended it

    run(body(), 180)


def _engine_pid(p: ServerProcess) -> int:
    return int(p.wait_for(ENGINE_PID).group(1))


def test_a_killed_engine_process_turns_health_not_serving_and_the_server_exits_non_zero(
        ) -> None:
    with ServerProcess(["--health-port", "0"]) as p, \
            grpc.insecure_channel(f"127.0.0.1:{p.health_port}") as probe, \
            WarmgateClient(p.target, timeout=60) as client:
        assert client.wait_ready(60) is WaitResult.READY
        check = health_pb2_grpc.HealthStub(probe).Check
        assert check(health_pb2.HealthCheckRequest(service=""), timeout=5).status == SERVING
        pid = _engine_pid(p)
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        deadline = killed + 30
        while check(health_pb2.HealthCheckRequest(service=""), timeout=5).status != NOT_SERVING:
            assert time.monotonic() < deadline, p.log_tail()
            time.sleep(0.05)
        code = p.wait_exit(max(1.0, deadline - time.monotonic()))
        exited = time.monotonic() - killed
        log = p.log()
    assert code != 0 and exited < 30, (code, exited, log)
    assert f"the engine process (pid {pid})" in log and "stopped (exit code 70)" in log


def test_a_hung_serving_step_kills_the_engine_and_exits_non_zero() -> None:
    # SIGSTOP freezes the engine mid-run: alive, silent, its pipe open.
    with ServerProcess(["--engine-step-timeout", "1", "--max-model-len", "4096"]) as p, \
            WarmgateClient(p.target, timeout=60) as client:
        assert client.wait_ready(60) is WaitResult.READY
        pid = _engine_pid(p)
        stream = client.generate([1, 2, 3], max_tokens=4000, ignore_eos=True, timeout=25)
        next(iter(stream))
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            with pytest.raises(WarmgateRpcError) as info:
                for _ in stream:
                    pass
            assert info.value.code is grpc.StatusCode.UNAVAILABLE
            code = p.wait_exit(30)
        finally:
            if _alive(pid):  # a stopped process reads no end of file: never leave one
                os.kill(pid, signal.SIGKILL)
        log = p.log()
    assert code == 70 and time.monotonic() - stopped < 30, log
    assert "a serving step made no progress" in log and not _alive(pid)


def test_sigterm_mid_stream_ends_every_stream_with_a_clear_status_and_no_process_left(
        ) -> None:
    flags = ["--shutdown-grace", "1", "--max-model-len", "4096"]
    with ServerProcess(flags, stop_signal=signal.SIGTERM) as p, \
            WarmgateClient(p.target, timeout=60) as client:
        assert client.wait_ready(60) is WaitResult.READY
        pid = _engine_pid(p)
        ends: list[str] = []

        async def streams() -> None:
            async with AsyncWarmgateClient(p.target) as c:
                async def one(i: int) -> None:
                    try:
                        async for _m in c.generate(prompt(4 + i, offset=i), max_tokens=4000,
                                                   ignore_eos=True):
                            pass
                        ends.append("finished")
                    except WarmgateRpcError as exc:
                        ends.append(f"{exc.code.name}: {exc.message}")

                tasks = [asyncio.ensure_future(one(i)) for i in range(4)]
                await asyncio.sleep(0.5)
                p.proc.send_signal(signal.SIGTERM)
                await asyncio.gather(*tasks)

        asyncio.run(asyncio.wait_for(streams(), 60))
        code = p.wait_exit(30)
        log = p.log()
    assert code == 0, log
    assert len(ends) == 4 and all(e.startswith("UNAVAILABLE") and "shutting down" in e
                                  for e in ends), ends
    assert not _alive(pid), log
    assert f"engine process {pid} stopped (exit code 0)" in log


SMALL_WINDOW = [("grpc.http2.lookahead_bytes", 256), ("grpc.http2.bdp_probe", 0)]
STALL_S = 3.0
OTHER_TOKENS = 100


def test_a_stalled_reader_does_not_slow_the_other_streams() -> None:
    config = server_config("--engine-process", "--max-model-len", "2048")

    async def body() -> None:
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()

            async def other() -> tuple[float, float]:
                """The other stream's duration and median inter-token gap."""
                start = last = time.perf_counter()
                gaps = []
                async for _m in c.generate([4, 5, 6], max_tokens=OTHER_TOKENS,
                                           ignore_eos=True):
                    now = time.perf_counter()
                    gaps.append(now - last)
                    last = now
                return last - start, statistics.median(gaps)

            alone, alone_itl = await other()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{s.port}",
                                                 options=SMALL_WINDOW) as channel:
                call = gen_grpc.GenerationStub(channel).Generate(generate_request(
                    [1, 2, 3], max_tokens=1500, ignore_eos=True))
                stalled = call.__aiter__()
                await stalled.__anext__()  # then the reader stops
                beside, beside_itl = await other()
                call.cancel()
        print(f"alone {alone:.3f} s (ITL {alone_itl * 1e3:.2f} ms), beside a stalled reader "
              f"{beside:.3f} s (ITL {beside_itl * 1e3:.2f} ms)")
        # A step loop that waited on the stalled reader would add the whole stall; beside a
        # second running stream each step does a little more, on a shared CI CPU.
        assert beside < max(4 * alone, alone + 1.0) and beside < STALL_S, (alone, beside)

    run(body(), 120)


def _scrape(port: int | None) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def test_a_compile_after_ready_in_the_engine_is_counted_and_strict_jit_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Read by load_server_config; the engine's FaultInjector records a Triton compile at the
    # mixed phase's first step of every run (the plan's: before ready; a MixedWarmup's: after).
    monkeypatch.setenv("WARMGATE_FAULT_INJECT", "mixed:jit")
    from warmgate.server.startup import load_server_config

    config = load_server_config(["--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
                                 "--device", "cpu", "--no-warmup-on-start", "--engine-process",
                                 "--strict-jit", "fail"])

    async def body() -> None:
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            report = await c.warmup_kernels()
            assert report.outcome == pb.WARMUP_OUTCOME_SUCCEEDED
            compiled = {p.name: dict(p.compiles) for p in report.phases}
            assert compiled["mixed"] == {"triton": 1}  # billed by the engine's monitor
            assert await c.health() == SERVING
            await c.mixed_warmup(8)
            await eventually(lambda: not s.controller.serving, 10)
            status = await c.get_status()
            assert status.state == pb.WARMUP_STATE_FAILED
            assert "compile after ready: triton" in status.failure_reason
            text = await asyncio.to_thread(_scrape, s.metrics_port)
            for after_ready in ("true", "false"):
                assert (f'warmgate_jit_compiles_total{{after_ready="{after_ready}",'
                        f'kind="triton",rank="0"}} 1.0') in text, text

    run(body(), 120)


def test_step_events_cross_as_rows_and_come_back_equal() -> None:
    usage = Usage(num_steps=3, first_token_s=1.5)
    lp = [TokenLogprobs(7, -0.1, 1, [(7, -0.1)])]
    events = [StepEvent("a", [1, 2], 1.0, 2, 1), StepEvent("b", [3], 2.0, finish_reason=
                                                            FinishReason.STOP, usage=usage,
                                                            logprobs=lp, prompt_logprobs=lp),
              StepEvent("c", [], 3.0, error=MemoryError("no room"))]
    back = events_of_wire(pickle.loads(pickle.dumps(events_to_wire(events))))
    assert [(e.req_id, e.token_ids, e.time_s, e.num_draft_tokens, e.num_accepted_draft_tokens,
             e.finish_reason, e.usage, e.logprobs, e.prompt_logprobs) for e in back] == \
        [(e.req_id, e.token_ids, e.time_s, e.num_draft_tokens, e.num_accepted_draft_tokens,
          e.finish_reason, e.usage, e.logprobs, e.prompt_logprobs) for e in events]
    assert type(back[2].error) is MemoryError and str(back[2].error) == "no room"


def test_errors_cross_with_the_type_and_fields_their_stream_status_depends_on() -> None:
    def crossed(exc: BaseException) -> BaseException:
        return events_of_wire(pickle.loads(pickle.dumps(events_to_wire(
            [StepEvent("r", [], 0.0, error=exc)]))))[0].error  # type: ignore[return-value]

    # A constructor of other arguments than the message: rebuilt without calling it.
    dead_end = crossed(GrammarDeadEnd("sampling.regex", 3))
    status = _stream_error(dead_end)
    assert isinstance(status, InvalidArgument)
    assert [v.field for v in status.violations] == ["sampling.regex"]
    assert isinstance(crossed(GrammarViolation("token 5 refused")), GrammarViolation)
    assert isinstance(_stream_error(crossed(MemoryError("out of memory"))), ResourceExhausted)
    assert isinstance(_stream_error(crossed(torch.OutOfMemoryError("CUDA out of memory"))),
                      ResourceExhausted)
    assert isinstance(crossed(ShuttingDown()), ShuttingDown)
    error, phase = failure_to_wire(FatalDeviceError("serving", RuntimeError("CUDA error: x")))
    fatal = failure_of_wire(*pickle.loads(pickle.dumps((error, phase))))
    assert isinstance(fatal, FatalDeviceError) and fatal.phase == "serving"
    assert str(fatal.cause) == "CUDA error: x"


def _serial_steps(text: str, reason: str) -> float:
    match = re.search(rf'warmgate_serial_steps_total{{reason="{reason}"}} (\S+)', text)
    assert match is not None, text
    return float(match.group(1))


def test_the_engine_process_overlaps_steps_unless_told_not_to() -> None:
    """--async-scheduling reaches the engine's serving loop (it once ran every step serially
    there): a penalties request can't overlap, and only the overlapping loop says so."""
    counted: dict[bool, float] = {}
    tokens: dict[bool, list[list[int]]] = {}

    async def body(flags: tuple[str, ...], overlapped: bool) -> None:
        config = server_config("--engine-process", "--max-model-len", "256", *flags)
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()

            async def one(i: int) -> list[int]:
                return [t async for m in c.generate(prompt(4 + 3 * i, offset=i), max_tokens=10,
                                                    ignore_eos=True, presence_penalty=0.5)
                        for t in m.token_ids]

            tokens[overlapped] = list(await asyncio.gather(*[one(i) for i in range(3)]))
            text = await asyncio.to_thread(_scrape, s.metrics_port)
            counted[overlapped] = _serial_steps(text, "penalties")

    run(body((), True), 180)
    run(body(("--no-async-scheduling",), False), 180)
    assert counted[True] > 0 and counted[False] == 0, counted
    assert tokens[True] == tokens[False]
