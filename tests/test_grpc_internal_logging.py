"""One traceback per INTERNAL, and a bounded one: the error mapping used to run twice per
failed RPC (each run logged the traceback), a serving step's failure was logged by the loop
and again by every stream it ended, and one RecursionError wrote about 2,800 lines."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import pytest

from tests.grpc_harness import FakeEngine, run, server_config, serving
from tests.test_grpc_generate import collect
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.errors import WarmgateRpcError
from warmgate.server.core.tracebacks import HEAD_FRAMES, TAIL_FRAMES, compact_traceback
from warmgate.server.runner.scheduler_output import SchedulerOutput

SERVING = 1  # grpc.health.v1 SERVING
TRACEBACK = "Traceback (most recent call last)"
# Each frame prints its file line, its source line and the carets under it.
MAX_LINES = 3 * (HEAD_FRAMES + TAIL_FRAMES) + 10


def _ping(n: int) -> int:
    return _pong(n + 1)


def _pong(n: int) -> int:
    # Two functions in turn: Python's "[Previous line repeated]" folds only one.
    return _ping(n + 1)


def _tracebacks(caplog: pytest.LogCaptureFixture) -> int:
    return sum(r.getMessage().count(TRACEBACK) for r in caplog.records)


def test_a_recursion_error_in_a_handler_logs_one_short_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)

    async def body() -> None:
        async with serving(engine=FakeEngine()) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            def broken() -> None:
                _ping(0)

            s.controller.status = broken  # type: ignore[method-assign]
            for calls in (1, 2):
                with pytest.raises(WarmgateRpcError) as info:
                    await c.get_status()
                assert info.value.code is grpc.StatusCode.INTERNAL
                assert "RecursionError" in info.value.message
                # A fresh exception per call: one record with its traceback each, not two.
                assert _tracebacks(caplog) == calls and len(caplog.records) == calls
            assert await c.health("liveness") == SERVING  # and the server still answers

    run(body())
    [first, _] = [r.getMessage() for r in caplog.records if TRACEBACK in r.getMessage()]
    assert "frames omitted" in first and "RecursionError: maximum recursion depth" in first
    assert len(first.splitlines()) <= MAX_LINES


def test_a_failed_serving_step_logs_its_traceback_once_for_all_its_streams(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    raised: list[ZeroDivisionError] = []

    async def body() -> None:
        async with serving(server_config()) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            loop = s.generation.serving_loop
            assert loop is not None
            real = loop.runner.execute_model

            def failing(so: SchedulerOutput, *args: Any, **kwargs: Any) -> Any:
                # Steps that only free requests pass: the loop frees the failed ones.
                if so.total_num_scheduled_tokens > 0:
                    raised.append(ZeroDivisionError("injected step failure"))
                    raise raised[-1]
                return real(so, *args, **kwargs)

            loop.runner.execute_model = failing  # type: ignore[method-assign]
            results = await asyncio.gather(*(collect(c, [1, 2, 3 + i], max_tokens=4)
                                              for i in range(3)), return_exceptions=True)
            assert all(isinstance(r, WarmgateRpcError) and r.code is grpc.StatusCode.INTERNAL
                       and "injected step failure" in r.message for r in results), results
            loop.runner.execute_model = real  # type: ignore[method-assign]
            assert len((await collect(c, [1, 2], max_tokens=2)).token_ids) == 2

    run(body(), 120)
    # The loop logs each failed step's traceback; each stream it ended adds one line.
    assert 1 <= len(raised) <= 3 and _tracebacks(caplog) == len(raised)
    lines = [r for r in caplog.records if "its traceback is logged above" in r.getMessage()]
    assert len(lines) == 3


def test_a_short_stack_is_printed_whole_and_a_chain_keeps_every_exception() -> None:
    try:
        try:
            _ping(0)
        except RecursionError as exc:
            raise ValueError("while rendering") from exc
    except ValueError as exc:
        text = compact_traceback(exc)
    assert text.count(TRACEBACK) == 2 and text.count("frames omitted") == 1
    assert text.endswith("ValueError: while rendering")
    try:
        raise KeyError("shallow")
    except KeyError as exc:
        short = compact_traceback(exc)
    assert "omitted" not in short and "raise KeyError" in short
