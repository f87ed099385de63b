"""--stream-interval against a real server (tiny model, CPU): after the first message, which
carries the first token at once, each message carries at least N tokens (the last one what is
left), and the tokens are the ones one message a step gives."""

from __future__ import annotations

import pytest

from tests.grpc_harness import run, server_config, serving
from tests.runner_helpers import prompt
from tests.serving_helpers import reference_greedy
from tests.test_startup_errors import assert_one_line_exit_2, run_server
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.server.runner.model_runner import ModelRunner


@pytest.mark.parametrize("engine", ["--no-engine-process", "--engine-process"])
def test_messages_after_the_first_carry_the_interval_and_the_tokens_are_unchanged(
        engine: str) -> None:
    config = server_config(engine, "--stream-interval", "3")
    ids = prompt(7)

    async def body() -> None:
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            sizes, tokens = [], []
            async for message in c.generate(ids, max_tokens=11):
                sizes.append(len(message.token_ids))
                tokens += message.token_ids
            assert tokens == reference_greedy(ModelRunner(config.runner), ids, 11)
            # The first message carries what was queued when the handler read it (one token
            # unless the reader fell behind); each later one at least 3 but the last.
            assert all(n >= 3 for n in sizes[1:-1]) and sum(sizes) == 11
            assert len(sizes) <= 1 + -(-10 // 3)  # 4 messages at most where 11 came one a step

    run(body(), 120)


def test_an_interval_past_the_output_still_sends_the_first_token_ahead() -> None:
    """The rest wait for the end; a first message held back for the interval would carry all
    40 (the reader would have to fall 39 steps behind for that to happen otherwise)."""

    async def body() -> None:
        config = server_config("--stream-interval", "100")
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            sizes = [len(m.token_ids) async for m in c.generate(prompt(5), max_tokens=40)]
            assert len(sizes) == 2 and sum(sizes) == 40, sizes

    run(body(), 120)


@pytest.mark.parametrize(("flags", "env"), [(["--stream-interval", "0"], {}),
                                          ([], {"WARMGATE_STREAM_INTERVAL": "-2"})],
                         ids=["flag", "env"])
def test_an_interval_below_one_exits_2_naming_the_flag(flags: list[str],
                                                       env: dict[str, str]) -> None:
    assert_one_line_exit_2(run_server(*flags, env=env), "argument --stream-interval:")
