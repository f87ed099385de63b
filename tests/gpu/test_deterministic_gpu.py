"""--deterministic on CUDA in bf16, warmed by the real plan (CUDA graphs, the determinism phase):
probes give the same tokens and logprobs, bit for bit, alone and inside a random busy workload
(chunked prompts, mixed prefill and decode, preemption) on both GPU backends at k = 0 and 3,
and nothing compiles or misses a CUDA graph after ready, also with the attention's keys cut
every 64-key tile so the probes cross split boundaries. The default mode, same workload, is
shown to differ somewhere, so the equality is the mode's doing."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
import torch

from tests.gpu.test_backends_gpu import SHAPES
from tests.runner_helpers import tiny_config
from tests.serving_helpers import Served
from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.core.results import PhaseStatus
from warmgate.server.jit import JitMonitor
from warmgate.server.kernels.fixed_split_plan import FixedSplitPlan
from warmgate.server.runner.attention import triton_backend
from warmgate.server.runner.scheduler_output import SamplingParams
from warmgate.server.warmup.plan import load_runner, run_warmup_plan

NEW_TOKENS = 16
Outputs = dict[str, list[tuple[int, float]]]
Requests = dict[str, tuple[list[int], SamplingParams]]


def _config(backend: str, k: int, deterministic: bool, **kw: int) -> RunnerConfig:
    limits: dict[str, Any] = {"max_num_seqs": 8, "max_num_batched_tokens": 128,
                              "num_blocks": 128, **kw, **SHAPES}
    c = tiny_config(device="cuda", dtype="bfloat16", attention_backend=backend, num_spec=k,
                    block_size=16, max_model_len=256, **limits)
    return dataclasses.replace(c, numerics=dataclasses.replace(c.numerics,
                                                               deterministic=deterministic))


def _warmed(config: RunnerConfig) -> tuple[Served, JitMonitor]:
    monitor = JitMonitor()
    runner, load_phase = load_runner(config, jit_monitor=monitor)
    report = run_warmup_plan(runner, load_phase=load_phase)
    assert report.succeeded, report.to_dict()
    phase = next(p for p in report.phases if p.name == "determinism")
    expected = PhaseStatus.RAN if config.numerics.deterministic else PhaseStatus.SKIPPED
    assert phase.status is expected, phase.detail
    monitor.mark_ready()
    return Served(runner, async_scheduling=True), monitor  # type: ignore[arg-type]


def _probes(vocab: int) -> Requests:
    rng = random.Random(3)
    out = {}
    for i, n in enumerate((7, 19, 40, 66)):
        prompt = [rng.randrange(vocab) for _ in range(n)]
        params = (SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, logprobs=2) if i % 2
                  else SamplingParams(temperature=0.9, top_p=0.95, seed=500 + i,
                                      max_tokens=NEW_TOKENS, logprobs=2))
        out[f"probe{i}"] = (prompt, params)
    return out


def _busy(vocab: int, seed: int) -> Requests:
    rng = random.Random(seed)
    reqs = dict(_probes(vocab))
    for i in range(12):
        params = rng.choice([SamplingParams(temperature=0.0, max_tokens=rng.randrange(1, 30)),
                             SamplingParams(temperature=1.0, max_tokens=rng.randrange(1, 30))])
        reqs[f"c{i}"] = ([rng.randrange(vocab) for _ in range(rng.randrange(1, 120))], params)
    order = list(reqs)
    rng.shuffle(order)
    return {rid: reqs[rid] for rid in order}


def _serve(served: Served, reqs: Requests) -> Outputs:
    for rid, (prompt, params) in reqs.items():
        served.submit(rid, prompt, params)
    served.run()
    return {rid: [(lp.token_id, lp.logprob) for e in served.events if e.req_id == rid
                  for lp in e.logprobs] for rid in reqs if rid.startswith("probe")}


def _alone_and_busy(backend: str, k: int, deterministic: bool) -> tuple[Outputs, Outputs]:
    vocab = int(SHAPES["vocab_size"])  # type: ignore[call-overload]
    served, monitor = _warmed(_config(backend, 0, deterministic))
    alone: Outputs = {}
    for rid, req in _probes(vocab).items():
        served.events.clear()
        alone.update(_serve(served, {rid: req}))
    busy_served, busy_monitor = _warmed(_config(backend, k, deterministic, num_blocks=24,
                                                max_num_batched_tokens=64))
    busy = _serve(busy_served, _busy(vocab, seed=k))
    for m in (monitor, busy_monitor):
        counts = m.snapshot()
        assert not any(counts.after_ready.values()), counts.after_ready
        assert counts.graph_misses_after_ready == 0
    assert busy_served.scheduler.num_preemptions > 0  # the small cache forced some
    del served, busy_served
    torch.cuda.empty_cache()
    return alone, busy


@pytest.mark.parametrize("k", [0, 3])
@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
def test_probes_are_the_same_bits_alone_and_inside_a_busy_batch(backend: str, k: int) -> None:
    alone, busy = _alone_and_busy(backend, k, deterministic=True)
    assert all(len(out) == NEW_TOKENS for out in alone.values())
    assert busy == alone


@pytest.mark.parametrize("k", [0, 3])
def test_probes_crossing_key_splits_are_the_same_bits(monkeypatch: pytest.MonkeyPatch,
                                                      k: int) -> None:
    # One 64-key tile a split (the plan's C is the whole 256-key capacity here): the probes'
    # 7 to 66 prompt tokens and 16 new ones cross split boundaries in prefill chunks, in the
    # graph-replayed decodes that run the splits apart and in the mixed batches.
    monkeypatch.setattr(triton_backend, "fixed_split_plan",
                        lambda capacity, tile: FixedSplitPlan(tile, -(-capacity // tile)))
    alone, busy = _alone_and_busy("triton", k, deterministic=True)
    assert busy == alone


def test_the_default_mode_differs_on_the_same_workload() -> None:
    alone, busy = _alone_and_busy("triton", 0, deterministic=False)
    assert busy != alone
