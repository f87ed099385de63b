"""A text prompt too long to fit max_model_len is refused by its byte length before it is
tokenized, and tokenizing runs off the event loop: six 4 MB prompts at once are refused
while a health Check keeps answering within 250 ms. The byte bound itself is sound: no text
longer than it tokenizes to fewer than max_model_len tokens."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from tests.grpc_harness import run
from tests.text_helpers import MULTIBYTE_TEXT, train_tokenizer, write_tiny_model
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.errors import WarmgateRpcError
from warmgate.server.devtools.server_process import ServerProcess
from warmgate.server.text.prompt_bound import max_prompt_bytes

PROMPT_BYTES = 4_000_000
NUM_PROMPTS = 6
# A stalled event loop would hold health for the whole tokenization of a 4 MB prompt (seconds);
# a 2-core machine running the rest of the suite beside this test reaches about 0.1 s alone.
HEALTH_WITHIN_S = 0.25
SERVING = health_pb2.HealthCheckResponse.SERVING


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server process of its own: the clients here share no interpreter (GIL) with it."""
    model_dir = write_tiny_model(tmp_path_factory.mktemp("prompt-size"))
    with ServerProcess(["--model", str(model_dir)]) as process:
        with grpc.insecure_channel(process.target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            deadline = time.monotonic() + 120
            while stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status != SERVING:
                assert time.monotonic() < deadline, process.log_tail()
                time.sleep(0.1)
        yield process


class HealthProbe:
    """Health Checks one after another on a thread of their own, timed."""

    def __init__(self, target: str) -> None:
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._channel = grpc.insecure_channel(target)
        self._thread = threading.Thread(target=self._probe, daemon=True)
        self._thread.start()

    def _probe(self) -> None:
        stub = health_pb2_grpc.HealthStub(self._channel)
        while not self._stop.wait(0.01):
            start = time.monotonic()
            # Past its deadline: counted as the time it waited.
            with contextlib.suppress(grpc.RpcError):
                stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            self.latencies.append(time.monotonic() - start)

    def stop(self) -> list[float]:
        self._stop.set()
        self._thread.join()
        self._channel.close()
        return self.latencies


async def _refused(client: AsyncWarmgateClient, prompt: str) -> WarmgateRpcError:
    with pytest.raises(WarmgateRpcError) as info:
        async for _ in client.generate((), prompt=prompt, max_tokens=1, timeout=30):
            pass
    return info.value


@pytest.mark.slow
def test_six_4mb_prompts_are_refused_while_health_answers(server: ServerProcess) -> None:
    async def body() -> None:
        async with AsyncWarmgateClient(server.target) as client:
            prompts = [("The capital of France is Paris. " * (PROMPT_BYTES // 32 + 1))
                       [:PROMPT_BYTES - i] for i in range(NUM_PROMPTS)]
            probe = HealthProbe(server.target)
            await asyncio.sleep(0.1)
            start = time.monotonic()
            errors = await asyncio.gather(*(_refused(client, p) for p in prompts))
            took = time.monotonic() - start
            await asyncio.sleep(0.1)
            latencies = probe.stop()
            print(f"{NUM_PROMPTS} prompts of 4 MB refused in {took:.2f} s; health max "
                  f"{max(latencies) * 1000:.0f} ms over {len(latencies)} checks")
            for error in errors:
                assert error.code is grpc.StatusCode.INVALID_ARGUMENT, error
                [violation] = error.field_violations
                assert violation.subject == "prompt"
                assert "bytes" in violation.description and "cannot fit" in \
                    violation.description, violation.description
            assert max(latencies) < HEALTH_WITHIN_S

    run(body(), 60)


def _bert_like() -> Tokenizer:
    tok = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents()])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def test_byte_bound_is_sound_and_absent_where_text_can_vanish() -> None:
    for kind in ("byte_level", "byte_fallback"):
        tokenizer = train_tokenizer(kind)
        bound, why = max_prompt_bytes(tokenizer, 64)
        assert bound is not None, why
        special = max(tokenizer.get_vocab(with_added_tokens=True), key=len)
        longest = tokenizer.decode([max(tokenizer.get_vocab(with_added_tokens=False).items(),
                                        key=lambda kv: len(kv[0]))[1]])
        # The densest texts: the longest tokens repeated, spaces, multi-byte characters.
        for text in (special * 200, longest * 200, " " * 5000, MULTIBYTE_TEXT * 200,
                     "a" * 5000):
            size = len(text.encode())
            num_tokens = len(tokenizer.encode(text).ids)
            assert num_tokens * bound >= size * 64, (kind, text[:20], num_tokens, bound)
    # A normalizer that deletes (accents) and a pre-tokenizer that drops whitespace: a long
    # text can tokenize to almost nothing, so there is no byte bound.
    bound, why = max_prompt_bytes(_bert_like(), 64)
    assert bound is None and "may delete" in why

