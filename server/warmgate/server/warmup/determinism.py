"""The `determinism` phase: under --deterministic, prove before ready that a request's output
does not depend on its batch.

Two probes, one greedy and one seeded, both asking for logprobs, each run alone and then
inside a mixed batch (warmup/determinism_driver.py). Their tokens, logprobs and ranks must be
equal bit for bit; otherwise the phase FAILS naming the first differing output position, and
the plan with it, so a server whose kernels lost batch invariance (a new kernel choice, a
fallback path) never reports ready. It runs last, after the CUDA graphs: the probe's alone
decodes replay the captured graphs while its mixed steps run eagerly, the two paths serving
takes. Without --deterministic it is SKIPPED: nothing is promised there.
"""

from __future__ import annotations

import logging

from warmgate.server.config.runner_config import cdiv
from warmgate.server.core.phases import DETERMINISM
from warmgate.server.core.results import PhaseResult, PhaseStatus, SkipReason
from warmgate.server.runner.scheduler_output import SamplingParams
from warmgate.server.warmup.determinism_driver import Budget, ProbeDriver, ProbeRequest
from warmgate.server.warmup.runner_contract import WarmupRunner
from warmgate.server.warmup.steps import ExecuteModel, SampleTokens, kv_block_sizes, synced_timer

logger = logging.getLogger(__name__)

PROBE_PROMPT_LEN = 13
PROBE_NEW_TOKENS = 8
# Other lengths than the probe's, so the steps mix short and long prefills with decodes.
COMPANION_PROMPT_LENS = (5, 19, 9, 27, 3, 14)
COMPANION_NEW_TOKENS = 6
PROBES = (("greedy", SamplingParams(temperature=0.0, logprobs=1)),
          ("seeded", SamplingParams(temperature=0.8, top_p=0.95, seed=20261204, logprobs=1)))

Output = list[tuple[int, float, int]]  # (token, logprob, rank) per output position


def _tokens(n: int, offset: int, vocab: int) -> list[int]:
    # A short cycle, so the prompt repeats the way real text does.
    return [(offset + 7 * (i % 5) + i // 5) % vocab for i in range(n)]


def first_difference(alone: Output, mixed: Output) -> str | None:
    """A sentence naming the first output position where the two differ, or None."""
    for i, (a, b) in enumerate(zip(alone, mixed, strict=False)):
        if a != b:
            return (f"output position {i}: token {a[0]} logprob {a[1]!r} rank {a[2]} alone, "
                    f"token {b[0]} logprob {b[1]!r} rank {b[2]} inside a mixed batch")
    if len(alone) != len(mixed):
        return f"output length {len(alone)} alone, {len(mixed)} inside a mixed batch"
    return None


def run_determinism_check(runner: WarmupRunner, execute: ExecuteModel,
                          sample: SampleTokens) -> PhaseResult:
    if not runner.config.numerics.deterministic:
        return PhaseResult.skipped(DETERMINISM, SkipReason.NOT_DETERMINISTIC,
                                   "--deterministic is off: batch invariance is not promised")
    if runner.is_pooling_model:
        return PhaseResult.skipped(DETERMINISM, SkipReason.POOLING_MODEL,
                                   "a pooling model never samples tokens")
    k = runner.num_speculative_steps
    vocab = runner.config.model.vocab_size
    new = max(1, min(PROBE_NEW_TOKENS, (runner.max_model_len - k) // 2))
    prompt_len = max(1, min(PROBE_PROMPT_LEN, runner.max_model_len - new - k - 1))
    budget = Budget(block_size=kv_block_sizes(runner)[0], max_num_reqs=runner.max_num_reqs,
                    max_num_tokens=runner.max_num_tokens, num_spec_steps=k, vocab_size=vocab)
    companion_lens = _companions_that_fit(runner, budget, prompt_len + new + k)
    driver = ProbeDriver(execute, sample, budget)
    differences: list[str] = []
    with synced_timer(runner) as t:
        for name, params in PROBES:
            prompt = _tokens(prompt_len, 11, vocab)
            alone = ProbeRequest(f"determinism-{name}-alone", prompt, params, new)
            driver.run_alone(alone)
            mixed = ProbeRequest(f"determinism-{name}-mixed", prompt, params, new,
                                 draft_source=list(alone.output_token_ids) if k else [])
            companions = [ProbeRequest(f"determinism-{name}-c{i}", _tokens(n, 3 * i, vocab),
                                       SamplingParams(temperature=0.0, logprobs=i % 2 or None),
                                       COMPANION_NEW_TOKENS)
                          for i, n in enumerate(companion_lens)]
            driver.run_mixed(mixed, companions)
            diff = first_difference(alone.logprobs, mixed.logprobs)
            if diff is not None:
                differences.append(f"the {name} probe differs at {diff}")
    shapes = {"probes": len(PROBES), "prompt_len": prompt_len, "new_tokens": new,
              "companions": len(companion_lens), "num_speculative_steps": k}
    if differences:
        detail = ("determinism check failed: " + "; ".join(differences)
                  + " (a kernel on this path is batch dependent)")
        logger.error("phase=%s %s", DETERMINISM, detail)
        return PhaseResult(name=DETERMINISM, status=PhaseStatus.FAILED, duration_s=t[0],
                           num_steps=driver.steps, shapes=shapes, detail=detail)
    return PhaseResult(name=DETERMINISM, status=PhaseStatus.RAN, duration_s=t[0],
                       num_reqs=len(PROBES) * (2 + len(companion_lens)),
                       num_tokens=driver.tokens, num_steps=driver.steps, shapes=shapes,
                       detail=f"{len(PROBES)} probes x {new} tokens: the same tokens, "
                              "logprobs and ranks alone and inside a mixed batch of "
                              f"{len(companion_lens)} other requests")


def _companions_that_fit(runner: WarmupRunner, budget: Budget, probe_tokens: int) -> list[int]:
    """Companion prompt lengths (capped by max_model_len) whose blocks fit beside the probe's
    in one run; the mixed run still cuts the probe's prompt elsewhere without any."""
    free = runner.kv_cache_config.num_blocks - 1 - cdiv(probe_tokens, budget.block_size)
    lens: list[int] = []
    for n in COMPANION_PROMPT_LENS:
        n = max(1, min(n, runner.max_model_len - COMPANION_NEW_TOKENS - 1))
        need = cdiv(n + COMPANION_NEW_TOKENS, budget.block_size)
        if need <= free:
            lens.append(n)
            free -= need
    return lens
