"""A ragged batch padded the way its token bucket's CUDA graph replays it (requests of query
length 0, tokens that no request owns) gives its real rows the numbers the eager batch gives:
checked on the CPU by running the padded metadata eagerly, with the torch reference backend
and with the Triton kernels through the interpreter. (tests/gpu/ replays the real graphs.)"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.runner_helpers import MiniScheduler, make_runner, prompt
from warmgate.server.runner.cuda_graphs import CudaGraphRunner
from warmgate.server.runner.model_runner import ModelRunner

BUCKET = 16


def _use_triton_attention(runner: ModelRunner) -> None:
    pytest.importorskip("triton")
    from warmgate.server.runner.attention.triton_backend import TritonAttentionBackend

    runner.attention_backend = TritonAttentionBackend(runner.attention_spec)
    runner.model.backend = runner.attention_backend


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.slow)])
def test_padded_ragged_batch_matches_eager_rows(backend: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    runner = make_runner(max_num_seqs=4)
    if backend == "triton":
        _use_triton_attention(runner)
    graphs = CudaGraphRunner(runner._eager_forward, runner.attention_backend,
                             runner.input_batch, (), runner.decode_query_len,
                             runner.config.model.max_model_len, runner.device,
                             ragged_buckets=(BUCKET, 10**6))
    assert graphs.ragged_buckets == [BUCKET]  # buckets past max_num_batched_tokens dropped
    assert graphs.ragged_reqs(BUCKET) == 4  # max_num_seqs caps a bucket's requests
    original = runner._run_model
    checked: list[tuple[int, int]] = []

    def compare(inputs: Any) -> torch.Tensor:
        eager = original(inputs).clone()
        meta, n = inputs.meta, inputs.meta.num_tokens
        shape = graphs.ragged_shape(BUCKET)
        # The same step staged as the bucket's graph replays it.
        views = runner.input_batch.prepare_inputs(inputs.scheduled, lambda *_: shape).views
        graph_meta = graphs.graph_meta(shape, views)
        assert (graph_meta.num_reqs, graph_meta.num_tokens) == (4, BUCKET)
        assert graph_meta.query_start_loc.tolist()[meta.num_reqs:] == [n] * (5 - meta.num_reqs)
        padded = runner._eager_forward(views.input_ids.gpu, views.positions.gpu, graph_meta)
        torch.testing.assert_close(padded[:n], eager, atol=1e-5, rtol=1e-5)
        checked.append((meta.num_reqs, n))
        return eager

    sched = MiniScheduler(runner)
    sched.add("a", prompt(9))
    sched.step()  # a's prefill, eager
    monkeypatch.setattr(runner, "_run_model", compare)
    sched.add("b", prompt(7, offset=5))
    sched.add("c", prompt(3, offset=9))
    sched.step()  # a decodes beside b's and c's prefills
    assert checked == [(3, 11)]
