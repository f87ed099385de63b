"""The fused MoE kernel on the device: it equals the torch reference in bf16, runs without a
host sync and replays in a CUDA graph; and a small Qwen3-MoE-shaped random model warms up
(its moe phase autotunes every bucket), captures its graphs and serves random batches with 0
compiles, 0 autotunes and 0 graph misses after ready."""

from __future__ import annotations

import random

import pytest
import torch

from tests.gpu.test_backends_gpu import SHAPES
from tests.runner_helpers import tiny_config
from warmgate.server.config.moe_kernel import ExpertShape, bucket_of, candidates, table_launch
from warmgate.server.devtools.batch_driver import BatchDriver
from warmgate.server.devtools.random_batches import BatchDrawer, Limits
from warmgate.server.jit import JitMonitor
from warmgate.server.jit.events import AUTOTUNE
from warmgate.server.kernels.fused_moe import fused_moe
from warmgate.server.runner.attention import backend_available
from warmgate.server.runner.moe import route, torch_moe
from warmgate.server.warmup.plan import load_runner, run_warmup_plan

pytestmark = pytest.mark.gpu

# Qwen3-30B-A3B's routing (8 of 128 experts) on narrower experts.
EXPERTS, TOP_K, HIDDEN, INTER = 128, 8, 512, 256


def _case(tokens: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    kw = dict(device="cuda", generator=gen)
    x = torch.randn(tokens, HIDDEN, **kw).bfloat16()
    w13 = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, **kw) / HIDDEN ** 0.5).bfloat16()
    w2 = (torch.randn(EXPERTS, HIDDEN, INTER, **kw) / INTER ** 0.5).bfloat16()
    router = torch.randn(EXPERTS, HIDDEN, **kw).bfloat16()
    weights, ids = route(x @ router.T, TOP_K, renormalize=True)
    return x, w13, w2, weights, ids


@pytest.mark.parametrize("tokens", [1, 7, 64, 300, 2100])
def test_fused_moe_equals_the_reference_in_bf16_with_every_candidate(tokens: int) -> None:
    x, w13, w2, weights, ids = _case(tokens, tokens)
    want = torch_moe(x.float(), w13.float(), w2.float(), weights, ids)
    shape = ExpertShape(EXPERTS, TOP_K, HIDDEN, INTER)
    for launch in candidates(bucket_of(tokens), shape, max_tokens=4096):
        got = fused_moe(x, w13, w2, weights, ids, launch)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2, msg=str(launch))


@pytest.mark.parametrize("tokens", [4, 48])  # the per-slot kernels, the grouped GEMMs
def test_fused_moe_never_syncs_and_replays_in_a_cuda_graph(tokens: int) -> None:
    x, w13, w2, weights, ids = _case(tokens, 1)
    launch = table_launch(bucket_of(tokens), ExpertShape(EXPERTS, TOP_K, HIDDEN, INTER))
    eager = fused_moe(x, w13, w2, weights, ids, launch)  # compiles, outside the checks
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fused_moe(x, w13, w2, weights, ids, launch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fused_moe(x, w13, w2, weights, ids, launch)
    other = _case(tokens, 2)
    for src, dst in zip(other, (x, w13, w2, weights, ids), strict=True):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, fused_moe(*other, launch), rtol=0, atol=0)
    assert not torch.equal(captured, eager)  # the replay read the new routing


@pytest.mark.parametrize("tokens", [1, 8])
def test_the_fused_router_replays_in_a_cuda_graph_on_its_own_counts(tokens: int) -> None:
    """The fused router's last-program hand-off on the device (the interpreter runs programs
    one at a time and never races): 50 replays of a captured launch, each on new hidden
    states, each routing as F.linear then route and leaving the counts at zero."""
    from warmgate.server.kernels.moe_router import counts_for, router_top_k

    gen = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, 2048, device="cuda", generator=gen).bfloat16()
    router = (torch.randn(EXPERTS, 2048, device="cuda", generator=gen) / 20).bfloat16()
    counts = counts_for(torch.device("cuda"))
    router_top_k(x, router, counts, TOP_K, True)  # compiles, outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        weights, ids = router_top_k(x, router, counts, TOP_K, True)
    for _ in range(50):
        x.copy_(torch.randn(tokens, 2048, device="cuda", generator=gen).bfloat16())
        graph.replay()
        logits = torch.nn.functional.linear(x, router)
        want_w, want_i = route(logits, TOP_K, True)
        # cuBLAS adds in another order, which can move a logit by one bf16 step: the picks
        # (as sets: two of them that close may swap places) must agree wherever the k-th and
        # the next logit are further apart than that.
        kth = logits.float().topk(TOP_K + 1, dim=-1).values
        apart = (kth[:, -2] - kth[:, -1]) > 2 * kth[:, -2].abs() / 128
        assert torch.equal(ids[apart].sort(dim=-1).values, want_i[apart].sort(dim=-1).values)
        torch.testing.assert_close(weights[apart].sort(dim=-1).values,
                                   want_w[apart].sort(dim=-1).values, rtol=2e-2, atol=2e-3)
        assert not counts.any()


@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
@pytest.mark.parametrize("num_spec", [0, 3])
def test_a_qwen3_moe_model_serves_with_nothing_compiled_or_tuned_after_ready(
        backend: str, num_spec: int) -> None:
    if not backend_available(backend):
        pytest.skip(f"{backend} is not installed")
    moe = dict(SHAPES, architecture="qwen3_moe", num_experts=EXPERTS, num_experts_per_tok=TOP_K,
               moe_intermediate_size=INTER, norm_topk_prob=True)
    config = tiny_config(device="cuda", dtype="bfloat16", attention_backend=backend,
                         num_spec=num_spec, max_num_seqs=8, max_num_batched_tokens=300,
                         block_size=16, num_blocks=256, max_model_len=256, **moe)
    with JitMonitor() as monitor:
        runner, load = load_runner(config, jit_monitor=monitor)
        report = run_warmup_plan(runner, load_phase=load)
        assert report.succeeded, report.to_dict()
        phase = report.phase("moe")
        assert phase.shapes["buckets"] == [2, 32, 256, 2048]  # 2: the per-slot decode bucket
        assert phase.shapes["source"] == "autotune" and phase.compiles.get(AUTOTUNE) == 4
        # Triton compiles only in the first case of this process: later ones load its cache.
        assert phase.shapes["autotune_s"] > 0
        assert runner.cuda_graphs_captured
        monitor.mark_ready()
        driver = BatchDriver(runner)
        drawer = BatchDrawer(driver, Limits(8, 300, 256, num_spec, SHAPES["vocab_size"]),
                             random.Random(7))
        sizes = set()
        for _ in range(200):
            driver.step(drawer.next_plan()[1])
            sizes.add(monitor.current_batch.num_tokens)
        counts = monitor.snapshot()
        assert max(sizes) > 32 and min(sizes) <= 8  # decodes and prefills, several buckets
        assert counts.total_after_ready == 0, counts  # no compile, no autotune
        assert counts.graph_misses_after_ready == 0
