"""Run the sampler and the draft verifier at every row count a step can hand them, once.

Like the dense GEMMs (gemm_shapes), the sampler's sort, softmax, scatter and reduction
kernels are chosen per size and loaded on first launch; warmup's own batches sample only a
few row counts, so a first real batch of another size paid that (the first-batch figures in
bench/results/README.md). Each sampling variant
(greedy, temperature only, top-k/top-p, seeded, and a batch mixing them) runs for
1..max_num_seqs requests, and with num_speculative_steps > 0 the verifier too. CUDA only.
"""

from __future__ import annotations

from typing import Any

import torch

from warmgate.server.runner.sampling import SeededStream
from warmgate.server.runner.scheduler_output import GREEDY, SamplingParams
from warmgate.server.warmup.kernels import SEEDED, STOCHASTIC

TEMPERATURE_ONLY = SamplingParams(temperature=0.8)  # the stochastic path without top-k/p
VARIANTS: tuple[tuple[SamplingParams, ...], ...] = (
    (GREEDY,), (TEMPERATURE_ONLY,), (STOCHASTIC,), (SEEDED,),
    (GREEDY, STOCHASTIC, SEEDED, TEMPERATURE_ONLY))


def _batch(variant: tuple[SamplingParams, ...], n: int) -> list[SamplingParams]:
    return [variant[i % len(variant)] for i in range(n)]


def _streams(params: list[SamplingParams]) -> list[SeededStream | None]:
    return [SeededStream(p.seed, 0) if p.is_seeded and p.seed is not None else None
            for p in params]


@torch.inference_mode()
def sweep_sampler_rows(model_runner: Any) -> int:
    """sample() (and verify() with k drafts each) for 1..max_num_seqs requests per variant;
    returns the number of calls."""
    device = model_runner.device
    vocab = model_runner.config.model.vocab_size
    k = model_runner.num_speculative_steps
    max_reqs = model_runner.max_num_reqs
    logits = torch.randn(max_reqs * (1 + k), vocab, device=device, dtype=torch.float32)
    sampler = model_runner.sampler
    calls = 0
    for variant in VARIANTS:
        for n in range(1, max_reqs + 1):
            params = _batch(variant, n)
            sampler.sample(logits[:n], params, _streams(params))
            calls += 1
            if k:
                drafts = [[0] * k for _ in range(n)]
                sampler.verify(logits[:n * (1 + k)], drafts, params, _streams(params))
                calls += 1
    return calls
