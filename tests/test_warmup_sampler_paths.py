"""The warmup's sampler phase runs every sampling feature through the real runner: each
logits processor beside plain rows of the same batch, in plain steps and (with speculation)
in verify steps, min_p, and the logprobs of generated and prompt tokens; the phase names
every path and why CUDA graphs do not apply."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from tests.runner_helpers import make_runner
from warmgate.server.runner import model_runner as model_runner_module
from warmgate.server.runner.sampling import processors, step, warpers
from warmgate.server.runner.sampling.logprobs import MAX_LOGPROBS
from warmgate.server.runner.sampling.rows import SamplingRows
from warmgate.server.warmup.kernels import SAMPLER, warmup_kernels
from warmgate.server.warmup.sampler_paths import FEATURE_VARIANTS, NOT_APPLICABLE

PROCESSORS = ("logit_bias", "min_tokens", "repetition_penalty", "presence_frequency_penalty")


@pytest.mark.parametrize("num_spec", [0, 2])
def test_every_sampling_feature_runs_in_the_sampler_phase(num_spec: int,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    # (processor, with drafts) -> [(rows it touched, rows in the batch)]
    seen: dict[tuple[str, bool], list[tuple[int, int]]] = defaultdict(list)
    for proc in processors.LOGITS_PROCESSORS:
        def recording(logits: Any, rows: SamplingRows, which: list[int], *,
                      _orig: Any = proc.apply, _name: str = proc.name) -> None:
            drafts = any(h.drafts for h in rows.histories)
            seen[(_name, drafts)].append((len(which), len(rows)))
            _orig(logits, rows, which)
        monkeypatch.setattr(proc, "apply", recording)
    min_p_calls: list[int] = []
    original_min_p = warpers.min_p_filter

    def min_p(x: Any, *rest: Any) -> Any:
        min_p_calls.append(x.shape[0])
        return original_min_p(x, *rest)
    monkeypatch.setattr(warpers, "min_p_filter", min_p)
    logprob_steps: list[int] = []
    original_sampled = step.sampled_logprobs

    def sampled(logits: Any, sampling: Any, tokens: Any, *rest: Any) -> Any:
        out = original_sampled(logits, sampling, tokens, *rest)
        if out is not None:
            logprob_steps.append(sum(len(e) for e in out))
            assert any(len(e.top) == MAX_LOGPROBS for per in out for e in per)
        return out
    monkeypatch.setattr(step, "sampled_logprobs", sampled)
    prompt_entries: list[int] = []
    original_prompt = model_runner_module.prompt_logprobs

    def prompt(*args: Any) -> Any:
        out = original_prompt(*args)
        prompt_entries.extend(len(p.entries) for p in out.values())
        return out
    monkeypatch.setattr(model_runner_module, "prompt_logprobs", prompt)

    runner = make_runner(num_spec=num_spec, max_num_seqs=4)
    result = warmup_kernels(runner, runner.execute_model, runner.sample_tokens)
    phase = next(p for p in result.phases if p.name == SAMPLER)
    for name in PROCESSORS:
        for drafts in ((False, True) if num_spec else (False,)):
            runs = seen[(name, drafts)]
            assert runs, (name, drafts)
            # Beside plain rows: the processor touched some rows of its batch, not all.
            assert any(0 < touched < total for touched, total in runs), (name, drafts, runs)
    assert min_p_calls and logprob_steps and prompt_entries
    assert phase.shapes["sampler_paths"][-len(FEATURE_VARIANTS) - 1:] == [
        *(name for name, _ in FEATURE_VARIANTS), "features_mixed"]
    assert phase.shapes["not_applicable"] == NOT_APPLICABLE
    assert "logit_bias" in phase.detail and "CUDA graphs" in phase.detail
