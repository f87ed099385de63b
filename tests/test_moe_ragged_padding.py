"""A Mixture-of-Experts model through the path a ragged CUDA graph takes on the GPU, on the CPU:
the Triton attention, routing, alignment and grouped-GEMM kernels run in the interpreter, with
the padded metadata the graphs capture and replay (requests of query length 0, tokens that no
request owns).

The attention kernels leave the rows of tokens that no request owns untouched, so a captured
graph's padding tokens carry whatever its buffers held: NaN here, as torch's
`fill_uninitialized_memory` fills every new tensor. Those rows reach the router like any other;
the routing must still name real experts (an expert id past the last one made the torch
alignment of buckets past 256 tokens index out of bounds while the server captured its graphs,
and made the kernel alignment of smaller buckets overwrite a real token's row), and the real
tokens' rows must equal an unpadded forward's.

On a machine with CUDA the interpreter is not forced: the same checks run on the GPU, and the
server's own capture of every graph with them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("triton")

from tests.kernel_device import kernel_device
from tests.runner_helpers import make_runner, prompt
from warmgate.server.config.moe_kernel import GEMV_MAX_TOKENS
from warmgate.server.kernels.fused_moe import ALIGN_KERNEL_MAX_BUCKET, fused_moe
from warmgate.server.kernels.moe_route import _route_kernel, route_topk
from warmgate.server.runner.cuda_graphs import CudaGraphRunner
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.moe import MoEBlock, route

DEVICE = kernel_device(_route_kernel)

# A Qwen3-MoE of the tiny preset's shape: 8 experts, 2 a token. One layer: its attention
# already leaves the padding rows NaN for its router, and a second layer would run the same
# kernels over the same bucket.
MOE = dict(architecture="qwen3_moe", num_experts=8, num_experts_per_tok=2,
           moe_intermediate_size=32, norm_topk_prob=True, num_layers=1)
# The largest ragged bucket the runner captures (the token budget) takes the torch alignment
# (past 256 tokens), the smaller ones the kernel's.
MAX_TOKENS = 264


@pytest.fixture
def uninitialized_is_nan() -> Iterator[None]:
    """Every tensor torch.empty returns is NaN (integers: their largest value), as stale
    buffers can be on the GPU."""
    was = (torch.are_deterministic_algorithms_enabled(),
           torch.is_deterministic_algorithms_warn_only_enabled(),
           torch.utils.deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was[0], warn_only=was[1])
        torch.utils.deterministic.fill_uninitialized_memory = was[2]


def _kernel_runner() -> tuple[ModelRunner, CudaGraphRunner]:
    """A tiny MoE runner whose attention, routing and experts are the kernels CUDA runs."""
    from warmgate.server.runner.attention.triton_backend import TritonAttentionBackend

    runner = make_runner(max_num_seqs=4, max_num_batched_tokens=MAX_TOKENS, num_blocks=256,
                         device=DEVICE, **MOE)
    runner.attention_backend = TritonAttentionBackend(runner.attention_spec)
    runner.model.backend = runner.attention_backend
    blocks = [m for m in runner.model.modules() if isinstance(m, MoEBlock)]
    assert blocks
    for block in blocks:  # a few tokens' router fused, more tokens' routed after cuBLAS
        block._route_fn, block._experts_fn = route_topk, fused_moe
        block.fuse_router()
    graphs = CudaGraphRunner(runner._eager_forward, runner.attention_backend,
                             runner.input_batch, (), runner.decode_query_len,
                             runner.config.model.max_model_len, runner.device,
                             runner.ragged_graph_buckets())
    return runner, graphs


def test_routing_names_a_real_expert_for_every_token_even_a_nan_one() -> None:
    logits = torch.tensor([[float("nan")] * 8, [0.0, 3.0, 1.0, float("nan"), 2.0, 0.0, 0.0, 0.0],
                           [float("inf")] * 8, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]],
                          device=DEVICE)
    for renormalize in (True, False):
        weights, ids = route_topk(logits, 2, renormalize)
        assert ids[:3].tolist() == [[0, 1]] * 3  # no probabilities: the lowest experts
        assert weights[:3].isnan().all()  # as torch's softmax and top-k give them
        want_w, want_i = route(logits[3:], 2, renormalize)
        assert torch.equal(ids[3:], want_i)
        torch.testing.assert_close(weights[3:], want_w)


@pytest.mark.slow
def test_capturing_the_largest_ragged_bucket_of_a_moe_model(uninitialized_is_nan: None) -> None:
    """What capture runs first, before recording the largest bucket's graph (the server's
    crash): an eager forward over padding alone, no request and no owned token."""
    runner, graphs = _kernel_runner()
    buckets = graphs.ragged_buckets
    bucket = max(buckets)  # the torch alignment's (the kernel's: the next test)
    assert bucket > ALIGN_KERNEL_MAX_BUCKET
    shape = graphs.ragged_shape(bucket)
    views = runner.input_batch.stage_empty(shape)
    with torch.inference_mode():
        out = runner._eager_forward(views.input_ids.gpu, views.positions.gpu,
                                    graphs.graph_meta(shape, views))
    assert out.shape[0] == bucket  # the padding's rows: no request reads them
    if DEVICE == "cuda":  # the server's capture of every graph, largest first
        torch.cuda.synchronize()
        info = runner.capture_cuda_graphs()
        torch.cuda.synchronize()
        assert bucket in info["ragged_buckets"]  # type: ignore[operator]


@pytest.mark.slow
@pytest.mark.parametrize(("bucket", "prompts"), [
    (GEMV_MAX_TOKENS, (1,)), (32, (9, 5)), (MAX_TOKENS, (9, 5))])
def test_a_padded_moe_batch_gives_its_real_tokens_the_unpadded_rows(
        bucket: int, prompts: tuple[int, ...], uninitialized_is_nan: None) -> None:
    """Prefills padded to a bucket (the per-slot kernels at 2 tokens, the kernel alignment at
    32, the torch one at 264) against the same prefills unpadded."""
    runner, graphs = _kernel_runner()
    from tests.runner_helpers import MiniScheduler

    assert runner.model.moe_launches.launch(bucket).per_slot is (bucket <= GEMV_MAX_TOKENS)

    original = runner._run_model
    checked: list[int] = []

    def compare(inputs: Any) -> torch.Tensor:
        eager = original(inputs).clone()
        n, shape = inputs.meta.num_tokens, graphs.ragged_shape(bucket)  # type: ignore[attr-defined]
        # The same step staged as the bucket's graph replays it.
        views = runner.input_batch.prepare_inputs(inputs.scheduled, lambda *_: shape).views
        graph_meta = graphs.graph_meta(shape, views)  # type: ignore[attr-defined]
        padded = runner._eager_forward(views.input_ids.gpu, views.positions.gpu, graph_meta)
        assert not padded[:n].isnan().any()
        torch.testing.assert_close(padded[:n], eager, atol=1e-4, rtol=1e-4)
        checked.append(n)
        return eager

    runner._run_model = compare  # type: ignore[method-assign]
    sched = MiniScheduler(runner)
    for i, length in enumerate(prompts):
        sched.add(f"r{i}", prompt(length, offset=3 * i))
    sched.step()
    assert checked == [sum(prompts)]
