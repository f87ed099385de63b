"""Tensor parallel on the CPU (gloo, real worker processes): the sharded model gives TP=1's
greedy tokens and, in float32, its logits within 1e-4; batched serving (chunked prefill,
mixed batches, speculative drafts) too; the warmup plan reports a `distributed` phase with
every rank's seconds."""

from __future__ import annotations

import pytest

from tests.reference_helpers import runner_for
from tests.runner_helpers import prompt, tiny_config
from tests.serving_helpers import Served, greedy
from tests.text_helpers import smollm2_dir
from tests.tp_helpers import greedy_with_logits, max_logit_gap, tp_runner
from warmgate.server.core.phases import PLAN_PHASES
from warmgate.server.core.results import PhaseStatus
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.warmup.plan import run_warmup_plan

NEW_TOKENS = 32
# SmolLM2's 3 ranks cost 0.4 s a token on 2 cores: 12 decodes after its 12-token prompt still
# cross the first 16-token KV block; the tiny model's runs keep NEW_TOKENS.
SMOLLM2_NEW_TOKENS = 12
LOGIT_TOLERANCE = 1e-4


def test_tiny_tp2_matches_tp1_tokens_and_logits() -> None:
    config = tiny_config()
    expected, expected_logits = greedy_with_logits(ModelRunner(config), prompt(17), NEW_TOKENS)
    with tp_runner(config, 2) as runner:
        tokens, logits = greedy_with_logits(runner, prompt(17), NEW_TOKENS)
    assert tokens == expected
    assert max_logit_gap(logits, expected_logits) < LOGIT_TOLERANCE


@pytest.mark.parametrize("num_spec", [0, 2])
def test_tiny_tp2_batched_serving_matches_tp1(num_spec: int) -> None:
    """Four requests together through the serving loop: same tokens for each."""
    config = tiny_config(num_spec=num_spec, max_num_batched_tokens=32)
    prompts = [prompt(n, offset=n) for n in (5, 40, 9, 23)]

    def serve(runner: ModelRunner) -> list[list[int]]:
        served = Served(runner)
        reqs = [served.submit(f"r{i}", p, greedy(12)) for i, p in enumerate(prompts)]
        served.run()
        return [list(r.output_token_ids) for r in reqs]

    expected = serve(ModelRunner(config))
    with tp_runner(config, 2) as runner:
        assert serve(runner) == expected


def test_warmup_plan_reports_every_ranks_distributed_phase() -> None:
    with tp_runner(tiny_config(num_spec=1), 2) as runner:
        report = run_warmup_plan(runner)
    assert report.succeeded, [(p.name, p.detail) for p in report.phases]
    names = [p.name for p in report.phases]
    # The distributed phase right after the load (not in this report), then the TP=1 plan.
    assert names[0] == "distributed" and names[1:] == list(PLAN_PHASES[1:])
    phase = report.phases[0]
    assert phase.status is PhaseStatus.RAN
    seconds = phase.shapes["rank_seconds"]
    assert len(seconds) == 2 and all(s > 0 for s in seconds)
    assert phase.duration_s == pytest.approx(max(seconds), abs=1e-6)
    assert phase.shapes["all_reduce_tokens"][-1] == runner.max_num_tokens
    assert phase.shapes["all_gather_rows"][-1] == runner.max_num_reqs * 2


@pytest.mark.slow
def test_smollm2_tp3_matches_tp1_tokens_and_logits() -> None:
    """9 heads and 3 KV heads over 3 ranks; tied embeddings, vocabulary 49152 in thirds."""
    config = runner_for(smollm2_dir(), max_model_len=128, max_num_seqs=1).config
    ids = [1, 9690, 314, 253, 5356, 28, 19835, 1132, 15441, 30, 216, 2]
    expected, expected_logits = greedy_with_logits(ModelRunner(config), ids,
                                                   SMOLLM2_NEW_TOKENS)
    with tp_runner(config, 3) as runner:
        tokens, logits = greedy_with_logits(runner, ids, SMOLLM2_NEW_TOKENS)
    assert tokens == expected
    assert max_logit_gap(logits, expected_logits) < LOGIT_TOLERANCE
