"""--pdl on the GPU (compute capability 9.0+): a tiny model with Llama-3.2-1B head shapes, and
a small Qwen3-MoE, warmed by the real plan with CUDA graphs, decode 20 greedy steps with PDL
on and with it off: the same tokens and the same logits, bit for bit, and nothing compiles,
tunes or misses a graph after ready with PDL on. Programmatic dependent launch changes when
kernels start, never what they compute: a kernel that read before its wait would show here
as logits that differ (or differ from run to run).

Both runs must run the same kernels: every linear of a few rows takes the Triton GEMV (a
timer that always says it is faster) and the MoE buckets the table's launches, where a
timing could pick another kernel, and so other bits, from one run to the next."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from tests.gpu.test_backends_gpu import SHAPES
from tests.runner_helpers import tiny_config
from warmgate.server.devtools.batch_driver import BatchDriver, DrivenRequest, Work
from warmgate.server.jit import JitMonitor
from warmgate.server.kernels import pdl
from warmgate.server.runner.scheduler_output import GREEDY
from warmgate.server.warmup.plan import load_runner, run_warmup_plan

pytestmark = pytest.mark.gpu

STEPS = 20
PROMPTS = {"a": 5, "b": 17, "c": 40}
MOE = dict(architecture="qwen3_moe", num_experts=16, num_experts_per_tok=4,
           moe_intermediate_size=256, norm_topk_prob=True)


@pytest.fixture(autouse=True)
def _hopper() -> None:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launch needs compute capability 9.0 or newer")


def _decode(on: bool, model: dict[str, Any]) -> tuple[list[list[int]], list[torch.Tensor]]:
    """(each request's tokens, each decode step's logits) of a warmed runner with --pdl `on`;
    asserts nothing compiled, tuned or missed a graph after ready."""
    config = tiny_config(device="cuda", dtype="bfloat16", attention_backend="triton",
                         max_num_seqs=8, max_num_batched_tokens=128, block_size=16,
                         num_blocks=128, max_model_len=256, **{**SHAPES, **model})
    config = dataclasses.replace(config, compilation=dataclasses.replace(config.compilation,
                                                                          pdl=on))
    monitor = JitMonitor()
    runner, load_phase = load_runner(config, jit_monitor=monitor)
    assert pdl.pdl_enabled() is on  # the runner set this process's switch
    runner.model.ops.linear_choices.timer = lambda weights, m, op: (2.0, 1.0)
    if runner.model.moe_launches is not None:
        runner.model.moe_launches.timer = None  # the table's launches
    report = run_warmup_plan(runner, load_phase=load_phase)
    assert report.succeeded, report.to_dict()
    assert runner.cuda_graphs_captured
    monitor.mark_ready()
    driver = BatchDriver(runner)
    reqs = [DrivenRequest(rid, [(13 * i + 7 * n) % 1000 for i in range(n)], GREEDY,
                          max_new_tokens=STEPS + 1) for rid, n in PROMPTS.items()]
    for r in reqs:
        driver.add(r)
    driver.step({r.req_id: Work(len(r.prompt_token_ids)) for r in reqs})
    logits = []
    for _ in range(STEPS):
        driver.step({r.req_id: Work(1) for r in reqs})
        assert runner.last_logits is not None
        logits.append(runner.last_logits.clone())
    counts = monitor.snapshot()
    assert counts.total_after_ready == 0, counts
    assert counts.graph_misses_after_ready == 0
    tokens = [list(r.output_token_ids) for r in reqs]
    del driver, runner
    torch.cuda.empty_cache()
    return tokens, logits


@pytest.mark.parametrize("model", [{}, MOE], ids=["dense", "moe"])
def test_pdl_decodes_the_same_bits_as_without(model: dict[str, Any]) -> None:
    try:
        off_tokens, off_logits = _decode(False, model)
        on_tokens, on_logits = _decode(True, model)
    finally:
        pdl.set_pdl(False)
    assert all(len(t) == STEPS + 1 for t in on_tokens)
    assert on_tokens == off_tokens
    for step, (on, off) in enumerate(zip(on_logits, off_logits, strict=True)):
        assert torch.equal(on, off), f"decode step {step}: logits differ with PDL"
