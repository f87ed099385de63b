"""Speculative decoding: verification must never change what greedy decoding produces."""

from __future__ import annotations

import random

import pytest
import torch

from tests.runner_helpers import MiniScheduler, make_runner, prompt, record_uniform_flags
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.request_state import RequestState
from warmgate.server.runner.scheduler_output import SamplingParams
from warmgate.server.warmup.steps import new_request, scheduler_output

NUM_SPEC = 3
NUM_TOKENS = 12


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return make_runner(num_spec=NUM_SPEC)


def greedy_reference(runner: ModelRunner, rid: str, p: list[int]) -> list[int]:
    """Plain greedy decoding, one token per step, no drafts."""
    sched = MiniScheduler(runner)
    sched.add(rid, p)
    while len(sched.tokens(rid)) < NUM_TOKENS:
        sched.step()
    tokens = sched.tokens(rid)[:NUM_TOKENS]
    sched.finish(rid)
    runner.execute_model(sched.schedule(num_tokens={}))
    return tokens


def speculate(runner: ModelRunner, rid: str, p: list[int],
              drafter: object) -> tuple[list[int], list[int]]:
    """Decode with NUM_SPEC drafts per step from drafter(stream_so_far) -> list[int]."""
    sched = MiniScheduler(runner)
    sched.add(rid, p)
    sched.step()
    accepted: list[int] = []
    while len(sched.tokens(rid)) < NUM_TOKENS:
        drafts = drafter(sched.tokens(rid))  # type: ignore[operator]
        out = sched.step(drafts={rid: drafts})
        assert out is not None
        accepted.append(out.num_accepted_draft_tokens[0])
        assert out.sampled_token_ids[0] == [*drafts[:accepted[-1]],
                                            out.sampled_token_ids[0][-1]]
    tokens = sched.tokens(rid)[:NUM_TOKENS]
    sched.finish(rid)
    runner.execute_model(sched.schedule(num_tokens={}))
    return tokens, accepted


def test_correct_drafts_are_all_accepted(runner: ModelRunner,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    p = prompt(6, offset=2)
    reference = greedy_reference(runner, "ref", p)
    flags = record_uniform_flags(runner, monkeypatch)

    def oracle(stream: list[int]) -> list[int]:
        n = len(stream)
        return (reference + [0] * NUM_SPEC)[n:n + NUM_SPEC]

    tokens, accepted = speculate(runner, "spec", p, oracle)
    assert tokens == reference
    # Every step but possibly the one running past NUM_TOKENS accepts all drafts.
    assert accepted[:-1] == [NUM_SPEC] * (len(accepted) - 1)
    assert len(accepted) < NUM_TOKENS - 1
    # Drafted decodes have q_len 1 + NUM_SPEC = decode_query_len: uniform decode.
    assert flags[1:] == [True] * len(accepted)


def test_random_drafts_are_rejected_and_output_is_unchanged(runner: ModelRunner) -> None:
    p = prompt(7, offset=5)
    reference = greedy_reference(runner, "ref2", p)
    rng = random.Random(0)

    def noisy(stream: list[int]) -> list[int]:
        n = len(stream)
        good = (reference + [0] * NUM_SPEC)[n:n + NUM_SPEC]
        # Half the time the right token, otherwise noise: some steps accept a prefix.
        return [t if rng.random() < 0.5 else rng.randrange(512) for t in good]

    tokens, accepted = speculate(runner, "spec2", p, noisy)
    assert tokens == reference
    assert any(a < NUM_SPEC for a in accepted)


def test_mixed_spec_and_plain_requests_in_one_batch(runner: ModelRunner) -> None:
    pa, pb = prompt(5, offset=11), prompt(8, offset=12)
    ref_a, ref_b = greedy_reference(runner, "ra", pa), greedy_reference(runner, "rb", pb)
    sched = MiniScheduler(runner)
    sched.add("a", pa)
    sched.add("b", pb)
    sched.step()
    while min(len(sched.tokens("a")), len(sched.tokens("b"))) < NUM_TOKENS:
        n = len(sched.tokens("a"))
        sched.step(drafts={"a": (ref_a + [0] * NUM_SPEC)[n:n + NUM_SPEC]})
    assert sched.tokens("a")[:NUM_TOKENS] == ref_a
    assert sched.tokens("b")[:NUM_TOKENS] == ref_b


def test_stochastic_verification_keeps_one_token_per_rejection(runner: ModelRunner) -> None:
    sched = MiniScheduler(runner)
    params = SamplingParams(temperature=1.0, seed=7)
    sched.add("s", prompt(6, offset=3), params)
    sched.step()
    out = sched.step(drafts={"s": [1, 2, 3]})
    assert out is not None
    a = out.num_accepted_draft_tokens[0]
    assert out.sampled_token_ids[0][:a] == [1, 2, 3][:a]
    assert len(out.sampled_token_ids[0]) == a + 1


def test_warmup_style_over_claimed_positions_run(runner: ModelRunner) -> None:
    # vLLM's warmup advances num_computed_tokens by 1 + k per decode step without reading
    # how many drafts were accepted, so it claims positions the runner never produced; the
    # runner runs such steps as scheduled, feeding the latest token it holds.
    prompt_len, decode_len = 2 + NUM_SPEC, 1 + NUM_SPEC
    blocks = list(range(1, 1 + -(-(prompt_len + 5 * decode_len) // 4)))
    new = new_request("w", list(range(prompt_len)), (blocks,), SamplingParams(temperature=0.0))
    runner.execute_model(scheduler_output(new_reqs=[new], num_scheduled={"w": prompt_len}))
    assert runner.sample_tokens(None) is not None
    computed = prompt_len
    for _ in range(5):
        so = scheduler_output(cached=[("w", computed, None)], num_scheduled={"w": decode_len},
                              spec_tokens={"w": [0] * NUM_SPEC})
        assert runner.execute_model(so) is None
        out = runner.sample_tokens(None)
        assert out is not None and 1 <= len(out.sampled_token_ids[0]) <= decode_len
        assert runner.last_logits is not None and torch.isfinite(runner.last_logits).all()
        computed += decode_len
    assert runner.input_batch.requests["w"].num_tokens < computed  # it did over-claim
    runner.execute_model(scheduler_output(finished={"w"}))


def test_a_position_past_the_stream_feeds_its_latest_token() -> None:
    """The rule the over-claimed steps above run on, for one input token (a decode)."""
    state = RequestState(req_id="r", prompt_token_ids=[5, 6, 7], sampling_params=None,
                         block_ids=[1], num_computed_tokens=3)
    assert [state.input_token(p) for p in (0, 2, 3)] == [5, 7, 7]  # no outputs: the prompt's
    state.output_token_ids += [8, 9]
    assert [state.input_token(p) for p in (3, 4, 5, 9)] == [8, 9, 9, 9]
    assert state.input_token_ids(2, 1) == [7] and state.input_token_ids(2, 3) == [7, 8, 9]
    with pytest.raises(ValueError, match="holds only 5"):
        state.input_token_ids(4, 2)  # past the end is a rule for one token only
