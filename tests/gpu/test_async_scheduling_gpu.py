"""Overlapped scheduling on a warmed CUDA runner (Llama-3.2-1B head shapes, random weights,
triton attention, CUDA graphs): the sampled tokens stay on the device between steps (pinned
copy, CUDA event) and the next step's input_ids get them by an index_copy_ before the graph
replay; greedy tokens equal the serial loop's, and serving compiles nothing and misses no
graph after ready."""

from __future__ import annotations

import pytest

from tests.gpu.warmed import warmed_cuda_runner
from tests.runner_helpers import prompt
from tests.serving_helpers import Served, greedy
from warmgate.server.jit.events import CUDA_GRAPH_MISS, JitEvent
from warmgate.server.runner.scheduler_output import SamplingParams

pytestmark = pytest.mark.gpu
WITH_LOGPROBS = SamplingParams(temperature=0.0, max_tokens=40, logprobs=2)


@pytest.mark.parametrize("num_spec", [0, 3])
def test_async_greedy_tokens_equal_the_serial_loops_on_triton_with_graphs(
        num_spec: int) -> None:
    pytest.importorskip("triton")
    runner, monitor, _ = warmed_cuda_runner("triton", num_spec)
    late: list[JitEvent] = []
    monitor.add_listener(lambda e: late.append(e) if e.after_ready and (
        e.compiled or e.kind == CUDA_GRAPH_MISS) else None)
    outputs = {}
    logprobs = {}
    replays = {}
    for async_scheduling in (False, True):
        assert runner.graph_runner is not None
        before = runner.graph_runner.num_replays
        served = Served(runner, async_scheduling=async_scheduling)
        assert served.loop.async_scheduling is async_scheduling
        # As many requests as max_num_seqs, the same max_tokens: both loops run the same
        # batches (a finishing request is never scheduled again), so bf16 rounding matches.
        # r0 asks for logprobs: with overlap they are gathered on the device with the token
        # and reach the host through the same pinned copy and event.
        reqs = [served.submit(f"r{i}", prompt(3 + 7 * i, offset=i),
                              WITH_LOGPROBS if i == 0 else greedy(40)) for i in range(8)]
        served.run()
        outputs[async_scheduling] = [r.output_token_ids for r in reqs]
        logprobs[async_scheduling] = [lp for e in served.events if e.req_id == "r0"
                                      for lp in e.logprobs]
        replays[async_scheduling] = runner.graph_runner.num_replays - before
        assert not runner.input_batch.requests
        reasons = {s.serial_reason for s in served.stats} - {None}
        assert reasons == ({"spec_decode"} if num_spec and async_scheduling else set())
    monitor.close()
    assert all(len(tokens) == 40 for tokens in outputs[True])
    assert outputs[True] == outputs[False]
    assert len(logprobs[True]) == 40 and logprobs[True] == logprobs[False]
    assert not late, [e.describe() for e in late]
    # The overlapped decodes replayed the captured graphs, reading input_ids the device wrote.
    assert replays[True] > 0 and replays[True] == replays[False]
