"""The continuous-batching scheduler and serving loop over a real tiny runner (CPU)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.runner_helpers import make_runner, prompt
from tests.serving_helpers import Served, greedy, reference_greedy
from warmgate.server.runner.scheduler_output import SamplingParams
from warmgate.server.serving.request import FinishReason, RequestStatus

PROMPTS = [prompt(n, offset=i) for i, n in enumerate((5, 19, 9, 33, 2, 14))]


def test_concurrent_greedy_requests_match_the_one_at_a_time_reference() -> None:
    # A 16-token budget chunks the longer prompts and mixes their chunks with decodes.
    served = Served(make_runner(max_num_batched_tokens=16, max_num_seqs=4))
    reqs = [served.submit(f"r{i}", p, greedy(12)) for i, p in enumerate(PROMPTS)]
    served.run()
    reference = make_runner()
    for req, p in zip(reqs, PROMPTS, strict=True):
        assert req.output_token_ids == reference_greedy(reference, p, 12), req.req_id
        assert req.finish_reason is FinishReason.LENGTH
    steps = served.steps
    assert all(so.num_reqs <= 4 and so.total_num_scheduled_tokens <= 16 for so in steps)
    # Some step ran a prefill chunk beside decodes, and some prompt was split into chunks.
    assert any(len(set(so.num_scheduled_tokens.values()) - {1}) and 1 in
               so.num_scheduled_tokens.values() for so in steps)
    assert max(r.usage.num_steps for r in reqs) > 12
    assert served.scheduler.pool.num_free == served.scheduler.pool.num_usable
    assert not served.runner.input_batch.requests


def test_speculative_greedy_output_is_identical_in_fewer_forward_passes() -> None:
    # The random tiny model falls into repeating one token after a few dozen: the n-gram
    # drafter's drafts are then accepted, and each step yields up to 4 tokens.
    prompts = [[7, 8, 9] * 4, prompt(12, 1), prompt(12, 2)]
    results = {}
    for k in (0, 3):
        served = Served(make_runner(num_spec=k, max_model_len=256, num_blocks=256))
        reqs = [served.submit(f"r{i}", p, greedy(100)) for i, p in enumerate(prompts)]
        served.run()
        results[k] = ([r.output_token_ids for r in reqs], len(served.steps),
                      sum(r.usage.num_accepted_draft_tokens for r in reqs))
    (plain, plain_steps, _), (spec, spec_steps, accepted) = results[0], results[3]
    assert spec == plain
    assert accepted > 0
    assert spec_steps < plain_steps


def test_exhausted_kv_blocks_preempt_and_every_request_still_completes() -> None:
    # 24 blocks of 4 tokens: six requests growing to ~40 tokens cannot all stay resident.
    served = Served(make_runner(num_blocks=24, max_num_seqs=6))
    reqs = [served.submit(f"r{i}", p, greedy(20)) for i, p in enumerate(PROMPTS)]
    served.run()
    assert served.scheduler.num_preemptions > 0
    assert sum(r.usage.num_preemptions for r in reqs) == served.scheduler.num_preemptions
    reference = make_runner()
    for req, p in zip(reqs, PROMPTS, strict=True):
        assert req.status is RequestStatus.FINISHED
        assert req.output_token_ids == reference_greedy(reference, p, 20), req.req_id
    assert served.scheduler.pool.num_free == 23
    assert not served.runner.input_batch.requests


def test_seeded_sampling_survives_preemption_and_batch_companions() -> None:
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=1234, max_tokens=16)
    alone = Served(make_runner())
    solo = alone.submit("solo", PROMPTS[3], params)
    alone.run()
    crowded = Served(make_runner(num_blocks=24, max_num_seqs=6))
    others = [crowded.submit(f"o{i}", p, greedy(20)) for i, p in enumerate(PROMPTS[:3])]
    target = crowded.submit("target", PROMPTS[3], params)
    crowded.run()
    assert crowded.scheduler.num_preemptions > 0
    assert all(o.status is RequestStatus.FINISHED for o in others)
    assert target.output_token_ids == solo.output_token_ids


def test_an_aborted_request_frees_its_blocks_and_runner_state() -> None:
    served = Served(make_runner())
    victim = served.submit("victim", PROMPTS[3], greedy(50))
    keeper = served.submit("keeper", PROMPTS[0], greedy(30))
    for _ in range(5):
        served.loop.step()
    held = len(victim.block_ids)
    assert held > 0 and "victim" in served.runner.input_batch.requests
    free_before = served.scheduler.pool.num_free
    served.loop.abort("victim")
    served.run()
    assert served.scheduler.pool.num_free == served.scheduler.pool.num_usable
    assert free_before + held + len(keeper.block_ids) <= served.scheduler.pool.num_usable
    assert victim.status is RequestStatus.FINISHED and victim.finish_reason is None
    assert keeper.finish_reason is FinishReason.LENGTH and len(keeper.output_token_ids) == 30
    assert not served.runner.input_batch.requests


def test_yielding_preempts_everything_and_resuming_gives_the_same_tokens() -> None:
    reference = Served(make_runner())
    ref_reqs = [reference.submit(f"r{i}", p, greedy(10)) for i, p in enumerate(PROMPTS[:3])]
    reference.run()
    served = Served(make_runner())
    reqs = [served.submit(f"r{i}", p, greedy(10)) for i, p in enumerate(PROMPTS[:3])]
    steps = iter(range(100))
    served.loop.run(lambda: next(steps) == 4)  # yield before the 5th step
    assert served.scheduler.pool.num_free == served.scheduler.pool.num_usable
    assert not served.runner.input_batch.requests  # a warmup now finds the runner empty
    assert all(r.status is RequestStatus.WAITING for r in reqs)
    served.run()
    assert [r.output_token_ids for r in reqs] == [r.output_token_ids for r in ref_reqs]


def test_stop_tokens_and_max_model_len_end_a_request_with_their_reason() -> None:
    first = Served(make_runner())
    probe = first.submit("probe", PROMPTS[1], greedy(6))
    first.run()
    stop_at = probe.output_token_ids[2]
    served = Served(make_runner(max_model_len=24))
    stopped = served.submit("stopped", PROMPTS[1], greedy(6, stop=[stop_at]))
    long = served.submit("long", PROMPTS[1], greedy(100))
    served.run()
    assert stopped.finish_reason is FinishReason.STOP
    assert stopped.output_token_ids == probe.output_token_ids[:3]
    assert long.finish_reason is FinishReason.MAX_MODEL_LEN
    assert len(PROMPTS[1]) + len(long.output_token_ids) == 24


@pytest.mark.parametrize("max_tokens", [1, 2, 5])
def test_speculative_steps_never_overshoot_max_tokens(max_tokens: int) -> None:
    served = Served(make_runner(num_spec=3))
    req = served.submit("r", [5, 6] * 6, greedy(max_tokens))
    served.run()
    assert len(req.output_token_ids) == max_tokens
    last_event = [e for e in served.events if e.req_id == "r"][-1]
    assert last_event.finish_reason is FinishReason.LENGTH and last_event.usage is not None


def test_the_block_pool_never_hands_out_the_runners_null_block() -> None:
    from warmgate.server.runner.kv_cache import NULL_BLOCK_ID
    from warmgate.server.serving.block_pool import NULL_BLOCK_ID as POOL_NULL
    from warmgate.server.serving.block_pool import BlockPool

    assert POOL_NULL == NULL_BLOCK_ID
    pool = BlockPool(5)
    assert pool.allocate(5) is None and pool.num_free == 4  # all or nothing
    blocks = pool.allocate(4)
    assert blocks is not None and NULL_BLOCK_ID not in blocks and pool.num_free == 0


def _prompt_tokens_beside_decodes(served: Served) -> list[int]:
    """Per step in which some request decoded (k=0: one token), the prompt tokens beside."""
    return [sum(n for n in so.num_scheduled_tokens.values() if n > 1) for so in served.steps
            if 1 in so.num_scheduled_tokens.values()]


@pytest.mark.parametrize("bound", [8, 0])
def test_prompt_tokens_beside_decodes_are_bounded(bound: int) -> None:
    """Two streams decode while a 120-token prompt arrives: with a bound, each of their steps
    carries at most `bound` prompt tokens (the budget's 64 only while nothing decodes), and
    the tokens are the one-at-a-time reference's; 0 lifts the bound."""
    served = Served(make_runner(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=160,
                                num_blocks=160))
    served.scheduler.limits = dataclasses.replace(
        served.scheduler.limits, max_prefill_tokens_while_decoding=bound)
    prompts = [prompt(5), prompt(6, offset=1), prompt(120, offset=2)]
    reqs = [served.submit(f"r{i}", p, greedy(16)) for i, p in enumerate(prompts)]
    served.run()
    beside = _prompt_tokens_beside_decodes(served)
    assert beside and max(served.steps[0].num_scheduled_tokens.values()) > 8
    if bound:
        assert max(beside) == bound
    else:
        assert max(beside) > 8
    reference = make_runner(max_model_len=160, num_blocks=160)
    for req, p in zip(reqs, prompts, strict=True):
        assert req.output_token_ids == reference_greedy(reference, p, 16), req.req_id
