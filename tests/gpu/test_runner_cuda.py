"""The runner's torch path on CUDA: same numbers as one full prefill, speculative decoding
equal to greedy, no host sync in a uniform-decode forward (so it can be captured), and one
sync per sampled step."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from tests.runner_helpers import MiniScheduler, full_prefill_logits, prompt, tiny_config
from warmgate.server.runner.cuda_graphs import capturing
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.scheduler_output import GREEDY, SamplingParams

pytestmark = pytest.mark.gpu


def _runner(dtype: str = "float32", num_spec: int = 0) -> ModelRunner:
    return ModelRunner(tiny_config(device="cuda", dtype=dtype, num_spec=num_spec))


@pytest.mark.parametrize(("dtype", "atol"), [("float32", 1e-3), ("bfloat16", 0.15)])
def test_decode_matches_full_prefill_on_cuda(dtype: str, atol: float) -> None:
    runner = _runner(dtype)
    sched = MiniScheduler(runner)
    p = prompt(9, offset=3)
    sched.add("a", p)
    sched.add("b", prompt(13, offset=4))
    sched.step()
    for _ in range(4):
        sched.step()
    got = sched.logits_of("a")[-1].clone()
    # The logits stay in the model's dtype (the sampler upcasts its own copies).
    assert got.device.type == "cuda" and got.dtype == getattr(torch, dtype)
    reference = full_prefill_logits(runner, p + sched.tokens("a")[:4])
    torch.testing.assert_close(got, reference, atol=atol, rtol=0)


def test_speculative_equals_greedy_on_cuda() -> None:
    runner = _runner(num_spec=3)
    p = prompt(6, offset=2)
    ref = MiniScheduler(runner)
    ref.add("ref", p)
    while len(ref.tokens("ref")) < 10:
        ref.step()
    reference = ref.tokens("ref")[:10]
    sched = MiniScheduler(runner)
    sched.free_blocks = sched.free_blocks[40:]
    sched.add("s", p)
    sched.step()
    while len(sched.tokens("s")) < 10:
        n = len(sched.tokens("s"))
        sched.step(drafts={"s": (reference + [0] * 3)[n:n + 3]})
    assert sched.tokens("s")[:10] == reference


def test_sampling_paths_run_on_cuda() -> None:
    runner = _runner()
    sched = MiniScheduler(runner)
    sched.add("g", prompt(5))
    sched.add("t", prompt(6), SamplingParams(temperature=0.8, top_k=20, top_p=0.9))
    sched.add("s", prompt(7), SamplingParams(temperature=0.8, seed=3))
    for _ in range(3):
        out = sched.step()
        assert out is not None and all(len(t) == 1 for t in out.sampled_token_ids)


def test_uniform_decode_forward_does_not_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = _runner(num_spec=1)
    sched = MiniScheduler(runner)
    for i in range(3):
        sched.add(f"r{i}", prompt(4 + i))
    sched.step()
    original = runner._run_model
    seen: list[bool] = []

    def strict(inputs: Any) -> torch.Tensor:
        seen.append(inputs.meta.is_uniform_decode)
        if not inputs.meta.is_uniform_decode:
            return original(inputs)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            return original(inputs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(runner, "_run_model", strict)
    sched.step(drafts={f"r{i}": [1] for i in range(3)})
    assert seen == [True]


@pytest.mark.parametrize("num_spec", [0, 3])
def test_a_sampled_step_waits_for_the_gpu_once(num_spec: int) -> None:
    """Only reading the step's tokens back may wait for the GPU. Any other sync (a
    torch.tensor(list, device=cuda) in the sampler is one) stalls the host until every
    queued kernel has run, so host and GPU work add up instead of overlapping."""
    runner = _runner(num_spec=num_spec)
    sched = MiniScheduler(runner)
    params = [GREEDY, SamplingParams(temperature=0.8, top_k=20, top_p=0.9),
              SamplingParams(temperature=0.7, seed=5)]
    for i, p in enumerate(params):
        sched.add(f"r{i}", prompt(5 + i), p)
    sched.step()  # the prefills
    drafts = {f"r{i}": [1] * num_spec for i in range(len(params))}
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = sched.step(drafts=drafts)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert out is not None and all(out.sampled_token_ids)
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) == 1, syncs


def test_graph_capture_keeps_the_allocators_cached_blocks() -> None:
    """torch.cuda.graph would empty the cache here; our capture leaves it, and the graph
    still replays what it recorded."""
    scratch = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    del scratch  # now a cached, free 64 MiB block
    reserved = torch.cuda.memory_reserved()
    x = torch.ones(4, device="cuda")
    (x * 2).sum()  # kernels loaded before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capturing(graph, torch.cuda.graph_pool_handle(), torch.cuda.Stream()):
        y = x * 2
    assert torch.cuda.memory_reserved() >= reserved
    x.fill_(3)
    graph.replay()
    torch.cuda.synchronize()
    assert y.tolist() == [6.0] * 4
