"""A hostile chat template, reached through one request's messages, fails that request within
its bound (INVALID_ARGUMENT on `messages`, naming the template and the bound), while a plain
request and GetStatus keep answering and the server's memory stays bounded."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest

from tests.grpc_harness import ServerThread, run, server_config, warmed_server_thread
from tests.text_helpers import CHATML_TEMPLATE, write_tiny_model
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.errors import WarmgateRpcError
from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.config.serving_config import ServingConfig
from warmgate.server.text import template_worker
from warmgate.server.text.model_text import load_model_text

TIMEOUT_S = 1.0
# What each hostile request may take to fail: the time bound plus a loaded machine's slack.
FAIL_WITHIN_S = TIMEOUT_S + 1.5
PLAIN_WITHIN_S = 2.0
RSS_GROWTH_MIB = 512
# The cases, chosen by the first message's content.
HOSTILE = (
    "{% macro recurse(n) %}{{ recurse(n + 1) }}{% endmacro %}"
    "{% set c = messages[0]['content'] %}"
    "{% if c == 'loop' %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
    "{% endfor %}"
    "{% elif c.startswith('multiply') %}{{ messages[0].content * 10**9 }}"
    "{% elif c == 'constant' %}{{ 'x' * 10**10 }}"
    "{% elif c == 'range' %}{% for i in range(10**12) %}{% endfor %}"
    "{% elif c == 'recurse' %}{{ recurse(0) }}"
    "{% elif c == 'pad' %}{{ c|center(10**9) }}"
    "{% elif c == 'flood' %}{% for i in range(100000) %}{% for j in range(100000) %}{{ c }}"
    "{% endfor %}{% endfor %}"
    "{% else %}" + CHATML_TEMPLATE + "{% endif %}")
PLAIN = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("hostile"), chat_template=HOSTILE)


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[ServerThread]:
    config = server_config("--model", str(model_dir), "--chat-template-timeout",
                           str(TIMEOUT_S))
    with warmed_server_thread(config) as thread:
        yield thread


def template_workers() -> list[psutil.Process]:
    """The chat template's worker processes under this one, found by the module they run."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if template_worker.__name__ in p.cmdline():
                found.append(p)
        except psutil.Error:
            continue
    return found


def tree_rss_mib() -> float:
    """This process (the server runs in it) and its template workers. Other children are not
    the server's to bound: a compile pool that torch starts for an earlier test in this worker
    (a few hundred MiB each) would be counted against the template."""
    total = 0
    for p in [psutil.Process(), *template_workers()]:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total / 2**20


class PeakRss:
    def __init__(self) -> None:
        self.start = tree_rss_mib()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, tree_rss_mib())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak - self.start


async def _generate(client: AsyncWarmgateClient, **kw: Any) -> float:
    start = time.monotonic()
    async for _ in client.generate(kw.pop("prompt_ids", ()), max_tokens=2, **kw):
        pass
    return time.monotonic() - start


async def _plain_traffic(client: AsyncWarmgateClient, stop: asyncio.Event,
                         latencies: list[float]) -> None:
    """Plain requests (token ids, chat) and GetStatus, one after another, until `stop`."""
    while not stop.is_set():
        latencies.append(await _generate(client, prompt_ids=[1, 2, 3],
                                         timeout=PLAIN_WITHIN_S))
        latencies.append(await _generate(client, messages=PLAIN, timeout=PLAIN_WITHIN_S))
        start = time.monotonic()
        await client.get_status(timeout=PLAIN_WITHIN_S)
        latencies.append(time.monotonic() - start)


@pytest.mark.parametrize(("content", "expected"), [
    ("loop", f"did not finish within {TIMEOUT_S} s (the time bound, --chat-template-timeout)"),
    ("multiply me", "the output bound"),
    ("constant", "the output bound"),
    ("range", "OverflowError: Range too big"),
    ("recurse", "RecursionError"),
    # A filter building 1 GB in one C call: the worker's address-space limit stops it.
    ("pad", "needed more than 256 MiB (the memory bound, --chat-template-memory)"),
    # Small pieces, 10**10 of them: counted as they come, stopped at the output bound.
    ("flood", "the rendered prompt passed"),
])
def test_hostile_template_fails_its_request_within_the_bound_and_the_server_keeps_serving(
        server: ServerThread, model_dir: Path, content: str, expected: str) -> None:
    async def body() -> None:
        async with AsyncWarmgateClient(server.target) as client:
            stop, latencies = asyncio.Event(), list[float]()
            assert template_workers()  # the workers the bound counts are found
            rss = PeakRss()
            traffic = asyncio.create_task(_plain_traffic(client, stop, latencies))
            await asyncio.sleep(0.2)
            start = time.monotonic()
            with pytest.raises(WarmgateRpcError) as info:
                await _generate(client, messages=[{"role": "user", "content": content}],
                                timeout=30)
            took = time.monotonic() - start
            await asyncio.sleep(0.5)  # the replaced worker, and traffic after it
            stop.set()
            await traffic
            grown = rss.stop()
            print(f"{content}: failed in {took:.2f} s; plain/status max "
                  f"{max(latencies):.2f} s over {len(latencies)}; RSS +{grown:.0f} MiB")
            assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT, info.value
            [violation] = info.value.field_violations
            assert violation.subject == "messages"
            assert str(model_dir / "chat_template.jinja") in violation.description
            assert expected in violation.description, violation.description
            assert took < FAIL_WITHIN_S
            assert max(latencies) < PLAIN_WITHIN_S
            assert grown < RSS_GROWTH_MIB
            # The server still renders the template for plain messages.
            await _generate(client, messages=PLAIN, timeout=PLAIN_WITHIN_S)

    run(body(), 60)


def test_constant_10gb_string_compiles_without_building_it(model_dir: Path) -> None:
    """jinja folds constant expressions when it compiles a template; `'x' * 10**10` is left
    to the render (where the output bound refuses it), and the load stays small and fast."""
    before = tree_rss_mib()
    start = time.monotonic()
    text = load_model_text(ModelConfig(weights_path=str(model_dir), vocab_size=512),
                           ServingConfig(chat_template_timeout_s=TIMEOUT_S))
    took = time.monotonic() - start
    assert text.tokenizer is not None and text.tokenizer.chat_template is not None
    assert took < 10 and tree_rss_mib() - before < RSS_GROWTH_MIB
    text.tokenizer.chat_template.close()
