"""Each GPU attention backend gives the torch backend's logits; graph replay gives eager's.

Two runners with the same seed hold the same weights; both are driven through the same
schedule, and before each decode step both are handed the same last token, so a near-tie in
a greedy sample cannot send them down different sequences.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.runner_helpers import MiniScheduler, prompt, tiny_config
from warmgate.server.config.rope_config import RopeConfig
from warmgate.server.runner.attention import backend_available
from warmgate.server.runner.cuda_graphs import CAPTURE_STEPS
from warmgate.server.runner.model_runner import ModelRunner

pytestmark = pytest.mark.gpu

# Llama-3.2-1B's attention and MLP shapes, 2 layers: real kernel shapes, short to run.
SHAPES = dict(vocab_size=32000, hidden_size=2048, num_layers=2, num_heads=32, num_kv_heads=8,
              head_dim=64, intermediate_size=8192, rope=RopeConfig(theta=500000.0))
PROMPTS = {"a": 5, "b": 17, "c": 33, "d": 100}
REL_TOL = 2e-2  # bf16 end to end through two layers and the LM head


def _runner(backend: str, num_spec: int = 0, graphs: bool = False,
            ragged: bool = True) -> ModelRunner:
    cfg = tiny_config(num_spec=num_spec, device="cuda", dtype="bfloat16",
                      attention_backend=backend, block_size=16, num_blocks=256,
                      max_model_len=512, max_num_seqs=8, max_num_batched_tokens=512,
                      **SHAPES)
    if not ragged:
        cfg = dataclasses.replace(cfg, compilation=dataclasses.replace(
            cfg.compilation, ragged_cuda_graphs=False))
    runner = ModelRunner(cfg)
    if graphs:
        info = runner.capture_cuda_graphs()
        # The capture's report splits its time by step, and the steps fit in the whole.
        spent = [info[step] for step in CAPTURE_STEPS]
        assert all(s > 0 for s in spent) and sum(spent) <= info["seconds"]
    return runner


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _force_last_token(sched: MiniScheduler, rid: str, token: int) -> None:
    state = sched.runner.input_batch.requests[rid]
    state.output_token_ids[-1] = token
    sched.reqs[rid].output_token_ids[-1] = token


class Pair:
    """The reference (torch) runner and the runner under test, driven in lockstep."""

    def __init__(self, ref: ModelRunner, test: ModelRunner) -> None:
        self.scheds = (MiniScheduler(ref), MiniScheduler(test))

    def add(self, rid: str, n: int) -> None:
        for s in self.scheds:
            s.add(rid, prompt(n, offset=len(rid) * 7 + n))

    def step(self, num_tokens: dict[str, int] | None = None,
             drafts: dict[str, list[int]] | None = None) -> dict[str, float]:
        ref, test = self.scheds
        for rid, req in ref.reqs.items():  # same decode input on both sides
            if req.output_token_ids and (num_tokens is None or rid in num_tokens):
                _force_last_token(test, rid, req.output_token_ids[-1])
        ref.step(num_tokens, drafts)
        test.step(num_tokens, drafts)
        ids = {r for r in ref.runner.last_logits_req_ids}
        return {rid: _rel(test.logits_of(rid), ref.logits_of(rid)) for rid in ids}


@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
@pytest.mark.parametrize("num_spec", [0, 3])
def test_backend_matches_torch(backend: str, num_spec: int) -> None:
    if not backend_available(backend):
        pytest.skip(f"{backend} is not installed")
    pair = Pair(_runner("torch", num_spec), _runner(backend, num_spec))
    for rid, n in PROMPTS.items():
        pair.add(rid, n)
    errors = {"prefill": pair.step()}
    drafts = {rid: [3, 1, 4][:num_spec] for rid in PROMPTS} if num_spec else None
    errors["uniform_decode"] = pair.step(drafts=drafts)
    # Mixed: one request decodes while a new one prefills.
    pair.add("e", 40)
    errors["mixed"] = pair.step(num_tokens={"a": 1, "e": 40})
    worst = {k: max(v.values()) for k, v in errors.items()}
    print(f"{backend} k={num_spec} relative logits error vs torch: {worst}")
    assert all(e <= REL_TOL for e in worst.values()), worst


@pytest.mark.parametrize("backend", ["torch", "triton", "flashinfer"])
@pytest.mark.parametrize("num_spec", [0, 3])
def test_graph_replay_matches_eager(backend: str, num_spec: int) -> None:
    if not backend_available(backend):
        pytest.skip(f"{backend} is not installed")
    # Uniform-decode graphs only: both runners prefill eagerly, so the decodes start from the
    # same KV cache (a ragged graph's prefill may round differently: the next test).
    eager = _runner(backend, num_spec)
    graphed = _runner(backend, num_spec, graphs=True, ragged=False)
    pair = Pair(eager, graphed)
    for rid, n in list(PROMPTS.items())[:3]:  # 3 requests: replay pads to the size-4 graph
        pair.add(rid, n)
    pair.step()
    replays = graphed.graph_runner.num_replays if graphed.graph_runner else 0
    drafts = {rid: [2, 7, 1][:num_spec] for rid in list(PROMPTS)[:3]} if num_spec else None
    for _ in range(3):
        errors = pair.step(drafts=drafts)
        assert max(errors.values()) <= 1e-3, errors
    assert graphed.graph_runner is not None
    assert graphed.graph_runner.num_replays == replays + 3


@pytest.mark.parametrize("backend", ["torch", "triton", "flashinfer"])
@pytest.mark.parametrize("num_spec", [0, 3])
def test_ragged_graph_replay_matches_eager(backend: str, num_spec: int) -> None:
    """Prefill and mixed batches replay their token bucket's graph where the backend allows
    it (triton; flashinfer, with the varlen kernel in the graph against its own prefill
    wrapper eagerly), with eager's logits; the torch reference runs them eagerly."""
    if not backend_available(backend):
        pytest.skip(f"{backend} is not installed")
    eager, graphed = _runner(backend, num_spec), _runner(backend, num_spec, graphs=True)
    assert graphed.graph_runner is not None
    supported = graphed.attention_backend.supports_ragged_graphs
    assert bool(graphed.graph_runner.ragged_graphs) == supported
    pair = Pair(eager, graphed)
    for rid, n in list(PROMPTS.items())[:3]:
        pair.add(rid, n)
    errors = pair.step()  # 55 prefill tokens: the 64-token bucket
    pair.add("e", 40)
    errors.update(pair.step(num_tokens={"a": 1, "e": 40}))  # mixed, 41 tokens
    print(f"{backend} k={num_spec} ragged graph vs eager relative logits error: "
          f"{max(errors.values()):.2e}")
    # Same kernels, but the dense GEMMs run at the bucket's token count: cuBLAS may pick
    # another tiling, so bf16 rounding can differ a little.
    assert max(errors.values()) <= REL_TOL / 2, errors
    assert graphed.graph_runner.num_ragged_replays == (2 if supported else 0)
