"""Backpressure: a Generate stream whose reader stops for a while never holds up the steps or the
other streams, and the tokens that piled up for it arrive together in its next messages."""

from __future__ import annotations

import asyncio
import statistics
import time

import grpc

from tests.grpc_harness import eventually, run, server_config, serving
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.generate import generate_request
from warmgate.server.api.stream_events import coalesce, gather
from warmgate.server.serving.request import FinishReason, StepEvent
from warmgate.v1 import generate_pb2_grpc as gen_grpc

# A receive window of a few messages, never grown: the server's writes to a reader that
# stops wait after a few hundred bytes, as they do over a real network once its window fills.
SMALL_WINDOW = [("grpc.http2.lookahead_bytes", 256), ("grpc.http2.bdp_probe", 0)]
STALLED_TOKENS = 600
OTHER_TOKENS = 100
# Inter-token gaps of the other stream while one reader stalls. Generous for a shared CI CPU;
# a step loop that waited on the stalled reader would show the whole stall (STALL_S) here.
MAX_GAP_S = 0.5
STALL_S = 3.0


def test_a_stalled_reader_slows_no_other_stream_and_gets_its_tokens_coalesced() -> None:
    config = server_config("--max-model-len", "2048", "--serve-before-ready")

    async def body() -> None:
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await eventually(lambda: s.controller.model_loaded, 60)
            reference = [t async for m in c.generate([1, 2, 3], max_tokens=STALLED_TOKENS,
                                                     ignore_eos=True) for t in m.token_ids]
            async with grpc.aio.insecure_channel(f"127.0.0.1:{s.port}",
                                                 options=SMALL_WINDOW) as channel:
                call = gen_grpc.GenerationStub(channel).Generate(generate_request(
                    [1, 2, 3], max_tokens=STALLED_TOKENS, ignore_eos=True))
                stalled = call.__aiter__()
                first = await stalled.__anext__()
                tokens, messages = list(first.token_ids), 1
                # The reader stops here; another stream runs to its end meanwhile.
                stall_end = time.monotonic() + STALL_S
                gaps: list[float] = []
                last = time.perf_counter()
                async for _m in c.generate([4, 5, 6], max_tokens=OTHER_TOKENS, ignore_eos=True):
                    now = time.perf_counter()
                    gaps.append(now - last)
                    last = now
                assert time.monotonic() < stall_end, "the other stream outlasted the stall"
                assert max(gaps) < MAX_GAP_S, (max(gaps), statistics.median(gaps))
                await asyncio.sleep(stall_end - time.monotonic())
                async for m in stalled:
                    tokens += m.token_ids
                    messages += 1
            assert tokens == reference
            # Fewer messages than tokens: what piled up came in a few messages, not one each.
            assert messages < len(tokens) // 2, (messages, len(tokens))

    run(body(), 120)


def _event(tokens: list[int], *, finish: FinishReason | None = None,
           error: BaseException | None = None) -> StepEvent:
    return StepEvent("r", tokens, float(len(tokens)), num_draft_tokens=len(tokens),
                     num_accepted_draft_tokens=1, finish_reason=finish, error=error)


def test_queued_events_merge_in_order_and_an_error_waits_behind_the_tokens() -> None:
    async def body() -> None:
        queue: asyncio.Queue[StepEvent] = asyncio.Queue()
        for e in (_event([2, 3]), _event([4], finish=FinishReason.LENGTH), _event([9])):
            queue.put_nowait(e)
        merged, held = coalesce(_event([1]), queue)
        assert merged.token_ids == [1, 2, 3, 4] and held is None
        assert merged.finish_reason is FinishReason.LENGTH
        assert (merged.num_draft_tokens, merged.num_accepted_draft_tokens) == (4, 3)
        assert queue.qsize() == 1  # nothing after the finish is taken
        error = RuntimeError("step failed")
        queue = asyncio.Queue()
        queue.put_nowait(_event([6]))
        queue.put_nowait(_event([], error=error))
        merged, held = coalesce(_event([5]), queue)
        assert merged.token_ids == [5, 6] and merged.error is None
        assert held is not None and held.error is error

    run(body())


def test_gather_waits_for_the_interval_and_stops_at_a_finish_or_an_error() -> None:
    async def body() -> None:
        queue: asyncio.Queue[StepEvent] = asyncio.Queue()
        later = asyncio.get_running_loop().call_later(
            0.05, queue.put_nowait, _event([3, 4]))  # arrives while gather waits
        merged, held = await gather(_event([1, 2]), queue, 3)
        assert merged.token_ids == [1, 2, 3, 4] and held is None  # at least 3, whole steps
        later.cancel()
        queue.put_nowait(_event([6], finish=FinishReason.STOP))
        merged, held = await gather(_event([5]), queue, 4)
        assert merged.token_ids == [5, 6] and merged.finish_reason is FinishReason.STOP
        error = RuntimeError("step failed")
        queue.put_nowait(_event([], error=error))
        merged, held = await gather(_event([7]), queue, 4)
        assert merged.token_ids == [7] and held is not None and held.error is error
        merged, held = await gather(_event([8, 9]), queue, 2)  # already enough: no wait
        assert merged.token_ids == [8, 9] and held is None and queue.empty()

    run(body())
