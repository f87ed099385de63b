"""Run the sampler and the draft verifier at every row count a step can hand them, once.

Like the dense GEMMs (gemm_shapes), the sampler's sort, softmax, scatter and reduction
kernels are chosen per size and loaded on first launch; warmup's own batches sample only a
few row counts, so a first real batch of another size paid that (the first-batch figures in
bench/results/README.md). Each sampling variant (greedy, temperature only, top-k/top-p,
seeded, a batch mixing them, every sampling feature in every row, and features beside plain
rows) runs for 1..max_num_seqs requests, and with num_speculative_steps > 0 the verifier
too; the logprobs gather runs at every logits row count, with the largest top-n and with
none. CUDA only. With a compile cache, only the sizes that launch every kernel run after the
first start (size_sweeps.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import torch

from warmgate.server.cache.shape_sweeps import SAMPLER_FILE
from warmgate.server.runner.sampling import MAX_LOGPROBS, SeededStream, TokenHistory
from warmgate.server.runner.sampling.logprobs import gather_logprobs
from warmgate.server.runner.scheduler_output import GREEDY, SamplingParams
from warmgate.server.warmup.kernels import SEEDED, STOCHASTIC
from warmgate.server.warmup.runner_contract import WarmupRunner
from warmgate.server.warmup.size_sweeps import (
    KernelProbe,
    SizeSweep,
    run_size_sweeps,
    will_learn,
)

TEMPERATURE_ONLY = SamplingParams(temperature=0.8)  # the stochastic path without top-k/p
# Every logits processor and min_p at once (each processor's own kernels at this row count).
ALL_FEATURES = replace(STOCHASTIC, presence_penalty=0.5, frequency_penalty=0.5,
                       repetition_penalty=1.2, min_p=0.05, min_tokens=1 << 30,
                       stop_token_ids=(0, 1), logit_bias=((0, -1.0), (1, 1.0)))
VARIANTS: tuple[tuple[SamplingParams, ...], ...] = (
    (GREEDY,), (TEMPERATURE_ONLY,), (STOCHASTIC,), (SEEDED,),
    (GREEDY, STOCHASTIC, SEEDED, TEMPERATURE_ONLY), (ALL_FEATURES,),
    (ALL_FEATURES, GREEDY, replace(ALL_FEATURES, temperature=0.0), SEEDED))
# A short history with repeats, so the penalties' scatters have tokens (and counts > 1).
_HISTORY = TokenHistory(prompt_token_ids=[2, 3, 2], output_token_ids=[3, 4, 4])


def _batch(variant: tuple[SamplingParams, ...], n: int) -> list[SamplingParams]:
    return [variant[i % len(variant)] for i in range(n)]


def _streams(params: list[SamplingParams]) -> list[SeededStream | None]:
    return [SeededStream(p.seed, 0) if p.is_seeded and p.seed is not None else None
            for p in params]


def _variant_name(variant: tuple[SamplingParams, ...]) -> str:
    """Its place in VARIANTS and a digest of its parameters: a map learned for other
    parameters (an older VARIANTS) lacks the name, and is not trusted."""
    digest = hashlib.sha256(repr(variant).encode()).hexdigest()[:12]
    return f"{VARIANTS.index(variant)}.{digest}"


def sampler_sweeps(model_runner: WarmupRunner) -> list[SizeSweep]:
    """sample() for 1..max_num_seqs requests per variant (and verify() with k drafts each),
    then the logprobs gather for 1..every logits row, with no top-n and the largest."""
    device = model_runner.device
    vocab = model_runner.config.model.vocab_size
    k = model_runner.num_speculative_steps
    max_reqs = model_runner.max_num_reqs
    rows = max_reqs * (1 + k)
    dtype = model_runner.model.dtype
    # In the names: a map learned on float32 logits does not describe bf16 ones.
    dt = str(dtype).removeprefix("torch.")
    held: list[torch.Tensor] = []  # the logits, made at the first call: building is free

    def logits() -> torch.Tensor:
        if not held:
            # The model's dtype: what compute_logits hands the sampler when serving.
            held.append(torch.randn(rows, vocab, device=device, dtype=dtype))
        return held[0]

    sampler = model_runner.sampler

    def sample(variant: tuple[SamplingParams, ...]) -> SizeSweep:
        def call(n: int) -> object:
            params = _batch(variant, n)
            return sampler.sample(logits()[:n], params, _streams(params), [_HISTORY] * n)
        return SizeSweep(f"sample:{_variant_name(variant)}:v{vocab}:{dt}:n1..{max_reqs}",
                         max_reqs, call, device)

    def verify(variant: tuple[SamplingParams, ...]) -> SizeSweep:
        def call(n: int) -> object:
            params = _batch(variant, n)
            return sampler.verify(logits()[:n * (1 + k)], [[0] * k for _ in range(n)], params,
                                  _streams(params), [_HISTORY] * n)
        return SizeSweep(f"verify:{_variant_name(variant)}:k{k}:v{vocab}:{dt}:n1..{max_reqs}",
                         max_reqs, call, device)

    def logprobs(top: int) -> SizeSweep:
        return SizeSweep(f"logprobs:top{top}:v{vocab}:{dt}:m1..{rows}", rows,
                         lambda m: gather_logprobs(logits(), range(m), [0] * m, [top] * m,
                                                   sampler.log_softmax),
                         device)

    sweeps = [sample(v) for v in VARIANTS]
    if k:
        sweeps += [verify(v) for v in VARIANTS]
    return [*sweeps, logprobs(0), logprobs(MAX_LOGPROBS)]


@torch.inference_mode()
def sweep_sampler_rows(model_runner: WarmupRunner, *, kernel_dir: Path | None = None,
                       probe: KernelProbe | None = None) -> int:
    """Every sampler_sweeps size once, or, with a kernel map in kernel_dir, only the sizes
    that launch every kernel (size_sweeps.run_size_sweeps); returns the calls made."""
    return run_size_sweeps(sampler_sweeps(model_runner), what="sampler rows",
                           file_name=SAMPLER_FILE, kernel_dir=kernel_dir, probe=probe)


def sampler_rows_learn(model_runner: WarmupRunner, kernel_dir: Path | None) -> bool:
    """Whether sweep_sampler_rows will learn its kernel map (under the probe, which sees every
    kernel the process launches) rather than run a kept one or learn nothing."""
    return will_learn(sampler_sweeps(model_runner), file_name=SAMPLER_FILE,
                      kernel_dir=kernel_dir)
