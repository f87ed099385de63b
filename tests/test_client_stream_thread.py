"""WarmgateClient reads a server stream on the thread that iterates it: a Generate starts no
thread (grpc's synchronous channel otherwise starts its "channel spin" thread each time a call
begins with none in flight, a cost on each time to first token), and a warmup followed with
on_progress, whose WatchStatus the call's end cancels from another thread, still ends."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from warmgate.client.api import WaitResult, WarmgateClient
from warmgate.server.devtools.server_process import ServerProcess
from warmgate.v1 import warmup_pb2 as pb


@pytest.fixture(scope="module")
def client() -> Iterator[WarmgateClient]:
    with ServerProcess(["--model", "tiny", "--max-model-len", "128"]) as server, \
            WarmgateClient(server.target, timeout=120) as c:
        assert c.wait_ready(120) is WaitResult.READY, server.log_tail()
        yield c


def test_a_generate_starts_no_thread(client: WarmgateClient,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    list(client.generate([1, 2, 3], max_tokens=2))  # the channel connected
    started: list[str] = []
    start = threading.Thread.start

    def counting(thread: threading.Thread) -> None:
        started.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", counting)
    for i in range(3):
        tokens = [t for m in client.generate([1, 2, 3 + i], max_tokens=3, ignore_eos=True)
                  for t in m.token_ids]
        assert len(tokens) == 3
    assert started == []


def test_a_followed_warmup_ends_when_its_call_does(client: WarmgateClient) -> None:
    seen: list[pb.WarmupStatus] = []
    report = client.warmup_kernels(force=True, on_progress=seen.append)
    assert report.outcome == pb.WARMUP_OUTCOME_SUCCEEDED
    assert seen
