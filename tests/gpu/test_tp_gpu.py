"""Tensor parallel on two GPUs (NCCL, a real worker process): the warmup plan succeeds with
its `distributed` phase and CUDA graphs that hold the all-reduces, and greedy tokens after
ready (graph replays and eager prefills) equal TP=1's, with no compile, CUDA-graph miss or
communicator set-up after ready on either rank (the worker's events relayed to rank 0).
Skipped with fewer than two GPUs."""

from __future__ import annotations

import pytest
import torch

from tests.runner_helpers import prompt, tiny_config
from tests.tp_helpers import greedy_with_logits, max_logit_gap, tp_runner
from warmgate.server.jit import JitMonitor
from warmgate.server.jit.install import install_observers
from warmgate.server.runner.attention import backend_available
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.warmup import run_warmup_plan

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")]
NEW_TOKENS = 16


@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
def test_tp2_warms_and_matches_tp1(backend: str) -> None:
    if not backend_available(backend):
        pytest.skip(f"{backend} is not installed")
    # head_dim 64: FlashInfer's SM90 prefill has no kernel for the tiny preset's 16.
    cfg = tiny_config(device="cuda", dtype="float32", attention_backend=backend,
                      block_size=16, num_blocks=256, max_model_len=256, max_num_seqs=8,
                      max_num_batched_tokens=256, hidden_size=256, head_dim=64)
    reference = ModelRunner(cfg)
    assert run_warmup_plan(reference).succeeded
    expected, expected_logits = greedy_with_logits(reference, prompt(9), NEW_TOKENS)
    del reference
    torch.cuda.empty_cache()
    with JitMonitor() as monitor:
        install_observers(monitor, cfg)  # rank 0's; each worker installs its own
        with tp_runner(cfg, 2, monitor) as runner:
            report = run_warmup_plan(runner)
            assert report.succeeded, [(p.name, p.detail) for p in report.phases]
            phases = {p.name: p for p in report.phases}
            assert len(phases["distributed"].shapes["rank_seconds"]) == 2
            assert runner.cuda_graphs_captured
            monitor.mark_ready()
            tokens, logits = greedy_with_logits(runner, prompt(9), NEW_TOKENS)
        by_rank = monitor.snapshot_by_rank()  # closed: every worker event has arrived
    assert tokens == expected
    assert max_logit_gap(logits, expected_logits) < 1e-3
    assert sorted(by_rank) == [0, 1]
    assert all(c.communicator_setups > 0 for c in by_rank.values()), by_rank
    assert [(c.total_after_ready, c.graph_misses_after_ready,
             c.communicator_setups_after_ready) for c in by_rank.values()] == [(0, 0, 0)] * 2, \
        by_rank
