"""The serving loop on a warmed CUDA runner: real scheduler traffic (chunked prefills, mixed
steps, decodes with drafts) finds every kernel compiled, every uniform decode
graph-captured (padded drafts keep decode batches uniform), and the caching allocator
holding the memory it needs (no cudaMalloc after ready)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.warmed import warmed_cuda_runner
from tests.runner_helpers import prompt
from tests.serving_helpers import Served, greedy
from warmgate.server.jit.events import CUDA_GRAPH_MISS, JitEvent

pytestmark = pytest.mark.gpu
# Real Llama-3.2-1B head shapes: FlashInfer's SM90 prefill kernels need head_dim >= 64 (the
# tiny preset's 16 fails their static assertion at JIT time).


@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
@pytest.mark.parametrize("num_spec", [0, 3])
def test_serving_after_warmup_compiles_nothing_and_misses_no_graph(backend: str,
                                                                   num_spec: int) -> None:
    pytest.importorskip(backend)
    runner, monitor, _ = warmed_cuda_runner(backend, num_spec)
    segments = torch.cuda.memory_stats()["segment.all.allocated"]
    late: list[JitEvent] = []
    monitor.add_listener(lambda e: late.append(e) if e.after_ready and (
        e.compiled or e.kind == CUDA_GRAPH_MISS) else None)
    served = Served(runner)
    reqs = [served.submit(f"r{i}", prompt(3 + 7 * i, offset=i), greedy(40)) for i in range(8)]
    served.run()
    monitor.close()
    assert all(len(r.output_token_ids) == 40 for r in reqs)
    assert not late, [e.describe() for e in late]
    new_segments = torch.cuda.memory_stats()["segment.all.allocated"] - segments
    assert new_segments == 0, f"serving after ready allocated {new_segments} CUDA segments"
    if num_spec:
        assert sum(r.usage.num_draft_tokens for r in reqs) > 0
    assert runner.graph_runner is not None
    # Prefill and mixed steps replayed graphs where the backend allows (triton, flashinfer).
    assert (runner.graph_runner.num_ragged_replays > 0) == \
        runner.attention_backend.supports_ragged_graphs
