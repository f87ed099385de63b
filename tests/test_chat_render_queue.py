"""Chat template renders against a live server: a request cancelled (here: its deadline
passed) is not rendered, so slow renders nobody waits for any more do not hold up the next
chat request; and the renders waiting for a worker are bounded (--chat-template-queue),
the excess refused RESOURCE_EXHAUSTED at once, naming the flags. 20 slow renders cancelled
at 0.3 s held the next chat request for 11 s (0.2 s alone)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import grpc
import pytest

from tests.grpc_harness import ServerThread, run, server_config, warmed_server_thread
from tests.text_helpers import CHATML_TEMPLATE, write_tiny_model
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.errors import WarmgateRpcError
from warmgate.server.config.serving_config import CHAT_TEMPLATE_QUEUE
from warmgate.server.startup import load_server_config
from warmgate.server.text.template_process import BoundedChatTemplate

# Longer than the tests take: a slow render ends only when its request is cancelled.
TIMEOUT_S = 10.0
WORKERS = 2
CANCELLED = 20
# All the cancelled ones are admitted, as with the default queue of 16 all but 2 would be.
QUEUE = CANCELLED - WORKERS
# A render that runs past the time bound, unless it is stopped first.
SLOW = ("{% if messages[0]['content'] == 'slow' %}{% for i in range(100000) %}"
        "{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}" + CHATML_TEMPLATE)
PLAIN = [{"role": "user", "content": "What is the capital of France?"}]
SLOW_MESSAGES = [{"role": "user", "content": "slow"}]
CANCEL_AFTER_S = 0.3
REFUSED = 6
# The next chat request after the cancelled ones: its time alone, plus a worker started
# afresh (the cancelled ones' were killed) on a loaded machine.
SLACK_S = 1.5


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    model = write_tiny_model(tmp_path_factory.mktemp("render-queue") / "model",
                             chat_template=SLOW)
    config = server_config("--model", str(model), "--chat-template-timeout", str(TIMEOUT_S),
                           "--chat-template-workers", str(WORKERS),
                           "--chat-template-queue", str(QUEUE))
    with warmed_server_thread(config) as thread:
        yield thread


async def _chat(client: AsyncWarmgateClient, messages: list[dict[str, str]],
                timeout: float) -> float:
    start = time.monotonic()
    async for _ in client.generate((), messages=messages, max_tokens=2, timeout=timeout):
        pass
    return time.monotonic() - start


async def _failure(client: AsyncWarmgateClient, messages: list[dict[str, str]],
                   timeout: float) -> WarmgateRpcError:
    with pytest.raises(WarmgateRpcError) as info:
        await _chat(client, messages, timeout)
    return info.value


async def _next_chat(client: AsyncWarmgateClient) -> float:
    """Seconds until a plain chat request is answered, right after clients gave up on
    theirs: the server sees a cancel a moment after the client sends it (its deadline, a
    moment after the client's), and until then the renders still count, so the first
    attempts may be refused; they are retried, and their time counted."""
    start = time.monotonic()
    while True:
        try:
            await _chat(client, PLAIN, 60)
            return time.monotonic() - start
        except WarmgateRpcError as exc:
            assert exc.code is grpc.StatusCode.RESOURCE_EXHAUSTED, exc
            await asyncio.sleep(0.02)


async def _until(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


async def _alone(client: AsyncWarmgateClient) -> float:
    return min([await _chat(client, PLAIN, 30) for _ in range(3)])


def _template(server: ServerThread) -> BoundedChatTemplate:
    tokenizer = server.running.generation.text.tokenizer
    assert tokenizer is not None and tokenizer.chat_template is not None
    return tokenizer.chat_template


async def _start_every_worker(client: AsyncWarmgateClient, server: ServerThread) -> None:
    """Plain chats side by side until every worker is started and idle: the slow renders
    then all begin at once, each in a worker, rather than some while their worker starts."""
    deadline = time.monotonic() + 30
    while _template(server).idle_workers < WORKERS:
        assert time.monotonic() < deadline
        await asyncio.gather(*(_chat(client, PLAIN, 30) for _ in range(4 * WORKERS)))


def test_cancelled_renders_do_not_hold_up_the_next_chat(server: ServerThread) -> None:
    async def body() -> None:
        async with AsyncWarmgateClient(server.target) as client:
            alone = await _alone(client)
            await _start_every_worker(client, server)
            errors = await asyncio.gather(*(_failure(client, SLOW_MESSAGES, CANCEL_AFTER_S)
                                            for _ in range(CANCELLED)))
            assert {e.code for e in errors} == {grpc.StatusCode.DEADLINE_EXCEEDED}, errors
            after = await _next_chat(client)
            print(f"chat alone {alone:.2f} s; after {CANCELLED} cancelled slow renders "
                  f"{after:.2f} s")
            assert after < alone + SLACK_S, (alone, after)

    run(body(), 120)


def test_renders_past_the_queue_are_refused_at_once(server: ServerThread) -> None:
    template = _template(server)

    async def body() -> None:
        async with AsyncWarmgateClient(server.target) as client:
            alone = await _alone(client)
            # A fixed sleep was too short on a loaded machine: wait for the server's own count.
            await _until(lambda: template.in_flight == 0)
            admitted = [asyncio.create_task(_chat(client, SLOW_MESSAGES, 60))
                        for _ in range(WORKERS + QUEUE)]
            await _until(lambda: template.in_flight == WORKERS + QUEUE)  # all admitted
            start = time.monotonic()
            refused = await asyncio.gather(*(_failure(client, SLOW_MESSAGES, 60)
                                             for _ in range(REFUSED)))
            took = time.monotonic() - start
            assert not any(task.done() for task in admitted)
            for error in refused:
                assert error.code is grpc.StatusCode.RESOURCE_EXHAUSTED, error
                assert (f"(--chat-template-workers {WORKERS} + --chat-template-queue "
                        f"{QUEUE})") in error.message, error.message
            assert took < 2.0, took  # refused, not queued behind the slow ones
            # Their clients give up: nothing of theirs is left to wait for, once the server
            # has seen the cancels (a moment after the client sent them).
            for task in admitted:
                task.cancel()
            await asyncio.gather(*admitted, return_exceptions=True)
            after = await _next_chat(client)
            assert after < alone + SLACK_S, (alone, after)

    run(body(), 120)


def test_a_request_cancelled_while_its_worker_starts_is_not_rendered(
        server: ServerThread) -> None:
    """With no worker idle, a render starts one first (an interpreter and jinja2: a good
    part of a second); a request cancelled meanwhile is not rendered on it, so the new
    worker is kept for the next request (a render it had begun would have been stopped by
    killing it)."""
    async def body() -> None:
        template = _template(server)
        async with AsyncWarmgateClient(server.target) as client:
            alone = await _alone(client)
            await _start_every_worker(client, server)
            # Slow renders cancelled while rendering: their workers are killed, none is idle.
            await asyncio.gather(*(_failure(client, SLOW_MESSAGES, CANCEL_AFTER_S)
                                   for _ in range(WORKERS)))
            await _until(lambda: template.in_flight == 0)
            assert template.idle_workers == 0
            killed = template.workers_killed
            # These take the free slots at once, each starting a worker; then their
            # clients leave.
            starting = [asyncio.create_task(_chat(client, SLOW_MESSAGES, 60))
                        for _ in range(WORKERS)]
            await _until(lambda: template.in_flight == WORKERS)
            await asyncio.sleep(0.05)
            for task in starting:
                task.cancel()
            await asyncio.gather(*starting, return_exceptions=True)
            await _until(lambda: template.in_flight == 0)
            assert template.workers_killed == killed
            after = await _next_chat(client)
            assert after < alone + SLACK_S, (alone, after)

    run(body(), 120)


def test_a_cancelled_request_leaves_the_queue_while_the_workers_are_busy(
        server: ServerThread) -> None:
    """Two slow renders nobody cancels hold both workers; the requests queued behind them
    and cancelled give their places back at once, not when a worker frees."""
    async def body() -> None:
        async with AsyncWarmgateClient(server.target) as client:
            await _start_every_worker(client, server)
            busy = [asyncio.create_task(_chat(client, SLOW_MESSAGES, 60))
                    for _ in range(WORKERS)]
            await asyncio.sleep(0.5)  # both rendering
            queued = await asyncio.gather(*(_failure(client, SLOW_MESSAGES, CANCEL_AFTER_S)
                                            for _ in range(QUEUE)))
            assert {e.code for e in queued} == {grpc.StatusCode.DEADLINE_EXCEEDED}, queued
            # The server sees each cancel a moment after its client's deadline: its own
            # count falls back to the two busy renders while both workers still render (a
            # fixed retry window was outrun on a loaded CI machine).
            template = _template(server)
            await _until(lambda: template.in_flight == WORKERS)
            # Room for a whole queue again: each of these is admitted and waits (until its
            # deadline), none is refused.
            again = await asyncio.gather(*(_failure(client, SLOW_MESSAGES, 1.0)
                                           for _ in range(QUEUE)))
            assert {e.code for e in again} == {grpc.StatusCode.DEADLINE_EXCEEDED}, again
            assert not any(task.done() for task in busy)
            for task in busy:
                task.cancel()
            await asyncio.gather(*busy, return_exceptions=True)
            await _next_chat(client)

    run(body(), 120)


def test_the_queue_is_a_flag_with_a_default() -> None:
    assert server_config().serving.chat_template_queue == CHAT_TEMPLATE_QUEUE
    assert load_server_config(["--chat-template-queue", "0"], environ={}
                              ).serving.chat_template_queue == 0
    with pytest.raises(SystemExit) as info:
        load_server_config(["--chat-template-queue", "-1"], environ={})
    assert info.value.code == 2
