"""The batches of the warmup's sampler phase: one per sampling path, each a prefill and its
decode steps, run through the real runner by warmup/kernels.py.

Plain paths (greedy, stochastic, seeded) get a batch each and then one batch mixing them,
because an all-greedy batch takes a different path from a mixed one. Every sampling feature
(logprobs, prompt logprobs, each penalty, min_p, min_tokens, logit_bias) gets a batch of
its own with plain rows between its rows (a processor touches only its rows, an index path
of its own), decoded with drafts and without when speculation is on, and a last batch
mixes every feature with plain rows. The sampler runs eagerly after the forward, outside any
CUDA graph, so there is no graph path for it to warm.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from warmgate.server.runner.sampling.logprobs import MAX_LOGPROBS
from warmgate.server.runner.scheduler_output import GREEDY, SamplingParams

# Stochastic sampling that exercises temperature, top-k and top-p together.
STOCHASTIC = SamplingParams(temperature=0.8, top_k=20, top_p=0.9)
SEEDED = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=1234)
SAMPLER_VARIANTS: tuple[tuple[str, SamplingParams], ...] = (
    ("greedy", GREEDY), ("stochastic", STOCHASTIC), ("seeded", SEEDED))
# min_tokens far above any warmup request's output, so the mask applies at every step.
_NEVER_REACHED = 1 << 30
FEATURE_VARIANTS: tuple[tuple[str, SamplingParams], ...] = (
    ("logprobs", replace(STOCHASTIC, logprobs=MAX_LOGPROBS)),
    ("prompt_logprobs", replace(GREEDY, prompt_logprobs=MAX_LOGPROBS)),
    ("presence_penalty", replace(STOCHASTIC, presence_penalty=0.5)),
    ("frequency_penalty", replace(GREEDY, frequency_penalty=0.5)),
    ("repetition_penalty", replace(STOCHASTIC, repetition_penalty=1.2)),
    ("min_p", SamplingParams(temperature=0.8, min_p=0.05)),
    ("min_tokens", replace(GREEDY, min_tokens=_NEVER_REACHED, stop_token_ids=(0, 1))),
    ("logit_bias", replace(SEEDED, logit_bias=((0, -1.0), (1, 1.0)))),
)
NOT_APPLICABLE = {
    "cuda_graphs": "the sampler runs eagerly after the graph-replayed forward; no graph "
                   "holds it, so every sampler path above is the one serving takes"}


@dataclass(frozen=True)
class SamplerBatch:
    name: str
    params: list[SamplingParams]  # one per request
    # Decode steps after the prefill: for each, whether the requests carry drafts.
    decodes: tuple[bool, ...]


def sampler_batches(num_reqs: int, num_spec: int) -> list[SamplerBatch]:
    spec = num_spec > 0
    batches = [SamplerBatch(name, [p] * num_reqs, (spec,)) for name, p in SAMPLER_VARIANTS]
    plain = [p for _, p in SAMPLER_VARIANTS]
    batches.append(SamplerBatch("mixed", _cycle(plain, num_reqs), ()))
    # With drafts, then without: a verify step and a plain step, each with the feature.
    decodes = (True, False) if spec else (False,)
    for name, p in FEATURE_VARIANTS:
        # Feature rows first, so a batch of one request still has the feature.
        batches.append(SamplerBatch(name, _cycle([p, GREEDY, p, STOCHASTIC], num_reqs),
                                    decodes))
    every = [p for _, p in FEATURE_VARIANTS]
    batches.append(SamplerBatch("features_mixed", _cycle([*every, *plain], num_reqs),
                                decodes))
    return batches


def _cycle(params: list[SamplingParams], n: int) -> list[SamplingParams]:
    return [params[i % len(params)] for i in range(n)]
