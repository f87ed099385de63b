"""The batched logits processors and min_p against transformers' own processors, row by row,
on random float32 logits and token histories; rows without an option are left bit for bit.

Tolerance: 1e-6 absolute. Both sides do the same float32 operations on each element (one
add, divide or multiply); only the presence/frequency reference (OpenAI's formula, written
out per token below) sums in a different order.
"""

from __future__ import annotations

import random

import pytest
import torch

from warmgate.server.runner.sampling import Sampler, TokenHistory
from warmgate.server.runner.sampling.processors import apply_logits_processors
from warmgate.server.runner.sampling.rows import SamplingRows
from warmgate.server.runner.sampling.warpers import min_p_filter
from warmgate.server.runner.scheduler_output import SamplingParams

transformers = pytest.importorskip("transformers")

VOCAB = 97
ATOL = 1e-6
CPU = torch.device("cpu")


def _history(rng: random.Random) -> TokenHistory:
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 30))]
    # Repeats, so counts above 1 happen.
    output = [rng.choice([*prompt, rng.randrange(VOCAB)]) for _ in range(rng.randrange(0, 25))]
    return TokenHistory(prompt, output)


def _batch(seed: int, n: int = 12) -> tuple[torch.Tensor, list[TokenHistory]]:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, VOCAB, generator=gen) * 4, [_history(rng) for _ in range(n)]


def _rows(params: list[SamplingParams], hist: list[TokenHistory]) -> SamplingRows:
    return SamplingRows.of(params, hist, CPU)


def _ids(h: TokenHistory, *, prompt: bool = True) -> torch.Tensor:
    tokens = list(h.all_tokens()) if prompt else list(h.output_tokens())
    return torch.tensor([tokens or [0]])


@pytest.mark.parametrize("seed", range(5))
def test_repetition_penalty_equals_transformers(seed: int) -> None:
    x, hist = _batch(seed)
    rng = random.Random(seed)
    params = [SamplingParams(repetition_penalty=rng.choice([1.0, 0.7, 1.3, 2.0]))
              for _ in hist]
    got = apply_logits_processors(x, _rows(params, hist))
    for i, (p, h) in enumerate(zip(params, hist, strict=True)):
        want = transformers.RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(
            _ids(h), x[i:i + 1].clone())[0] if p.repetition_penalty != 1.0 else x[i]
        torch.testing.assert_close(got[i], want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("seed", range(5))
def test_presence_and_frequency_penalties_follow_openais_formula(seed: int) -> None:
    """logit[t] -= frequency * count[t] + presence * (count[t] > 0), count over generated
    tokens only (prompt tokens are not penalised)."""
    x, hist = _batch(seed)
    rng = random.Random(seed)
    params = [SamplingParams(presence_penalty=rng.choice([0.0, 0.5, -1.0, 2.0]),
                             frequency_penalty=rng.choice([0.0, 0.3, -2.0])) for _ in hist]
    got = apply_logits_processors(x, _rows(params, hist))
    for i, (p, h) in enumerate(zip(params, hist, strict=True)):
        want = x[i].clone()
        for t in set(h.output_tokens()):
            count = list(h.output_tokens()).count(t)
            want[t] -= p.frequency_penalty * count + p.presence_penalty
        torch.testing.assert_close(got[i], want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("seed", range(5))
def test_min_tokens_equals_transformers_min_new_tokens(seed: int) -> None:
    x, hist = _batch(seed)
    rng = random.Random(seed)
    params = [SamplingParams(min_tokens=rng.choice([0, 5, 40]),
                             stop_token_ids=tuple(rng.sample(range(VOCAB), rng.randrange(0, 4))))
              for _ in hist]
    got = apply_logits_processors(x, _rows(params, hist))
    for i, (p, h) in enumerate(zip(params, hist, strict=True)):
        want = x[i]
        if p.stop_token_ids:
            proc = transformers.MinNewTokensLengthLogitsProcessor(
                len(h.prompt_token_ids), p.min_tokens, list(p.stop_token_ids))
            want = proc(_ids(h), x[i:i + 1].clone())[0]
        torch.testing.assert_close(got[i], want, atol=0, rtol=0)


@pytest.mark.parametrize("seed", range(5))
def test_logit_bias_equals_transformers_sequence_bias(seed: int) -> None:
    x, hist = _batch(seed)
    rng = random.Random(seed)
    params = [SamplingParams(logit_bias=tuple(sorted(
        {t: rng.uniform(-100, 100) for t in rng.sample(range(VOCAB), rng.randrange(0, 6))}
        .items()))) for _ in hist]
    got = apply_logits_processors(x, _rows(params, hist))
    for i, p in enumerate(params):
        want = x[i]
        if p.logit_bias:
            proc = transformers.SequenceBiasLogitsProcessor([[[t], b] for t, b in p.logit_bias])
            want = proc(_ids(hist[i]), x[i:i + 1].clone())[0]
        torch.testing.assert_close(got[i], want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("seed", range(5))
def test_min_p_equals_transformers_min_p_warper(seed: int) -> None:
    x, _ = _batch(seed)
    rng = random.Random(seed)
    min_p = [rng.choice([0.0, 0.05, 0.3, 1.0]) for _ in range(x.shape[0])]
    got = min_p_filter(x, torch.tensor(min_p))
    for i, m in enumerate(min_p):
        want = transformers.MinPLogitsWarper(m)(None, x[i:i + 1].clone())[0] if m else x[i]
        assert torch.equal(torch.isinf(got[i]), torch.isinf(want)), i
        torch.testing.assert_close(got[i], want, atol=0, rtol=0)


def test_all_processors_together_equal_transformers_in_vllms_order() -> None:
    """bias, min_tokens, repetition, then presence/frequency on the same rows."""
    x, hist = _batch(7, n=6)
    params = [SamplingParams(logit_bias=((3, 5.0), (10, -7.5)), min_tokens=100,
                             stop_token_ids=(1, 2), repetition_penalty=1.4,
                             presence_penalty=0.6, frequency_penalty=0.2)] * 6
    got = apply_logits_processors(x, _rows(params, hist))
    p = params[0]
    for i, h in enumerate(hist):
        want = transformers.SequenceBiasLogitsProcessor([[[3], 5.0], [[10], -7.5]])(
            _ids(h), x[i:i + 1].clone())
        want = transformers.MinNewTokensLengthLogitsProcessor(
            len(h.prompt_token_ids), p.min_tokens, [1, 2])(_ids(h), want)
        want = transformers.RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(
            _ids(h), want)[0]
        for t in set(h.output_tokens()):
            want[t] -= p.frequency_penalty * list(h.output_tokens()).count(t) \
                + p.presence_penalty
        torch.testing.assert_close(got[i], want, atol=1e-5, rtol=0)


def test_a_batch_without_options_gets_its_logits_back_untouched() -> None:
    x, hist = _batch(3)
    params = [SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_tokens=3)] * len(hist)
    assert apply_logits_processors(x, _rows(params, hist)) is x  # min_tokens, no stop ids
    before = x.clone()
    mixed = [SamplingParams(repetition_penalty=1.5), *params[1:]]
    out = apply_logits_processors(x, _rows(mixed, hist))
    assert out is not x and torch.equal(x, before)  # the raw logits stay raw (logprobs)
    assert torch.equal(out[1:], x[1:])


def test_sampler_applies_processors_before_the_greedy_choice() -> None:
    x = torch.zeros(2, VOCAB)
    x[:, 5] = 1.0
    params = [SamplingParams(temperature=0.0, logit_bias=((9, 2.0),)),
              SamplingParams(temperature=0.0, frequency_penalty=2.0)]
    hist = [TokenHistory([1], []), TokenHistory([1], [5])]
    assert Sampler().sample(x, params, [None, None], hist).tolist() == [9, 0]


@pytest.mark.parametrize("seed", range(3))
def test_verify_applies_the_processors_at_every_draft_position(seed: int) -> None:
    """Row j of a request is conditioned on the drafts before it: verifying drafts equal to
    what plain steps would produce accepts them all, and a wrong draft stops at the token a
    plain step would give there."""
    k = 3
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2 * (k + 1), VOCAB, generator=gen)
    # Position 0's favourite is made the favourite everywhere: only the penalties move on.
    x[:, int(x[0].argmax())] += 3.0
    params = [SamplingParams(temperature=0.0, frequency_penalty=2.0, presence_penalty=1.0,
                             repetition_penalty=1.3, min_tokens=5, stop_token_ids=(7,)),
              SamplingParams(temperature=0.0)]
    hist = [TokenHistory([1, 2, 3], [4, 4]), TokenHistory([5], [])]
    sampler = Sampler()

    def plain(req: int, drafts: list[int]) -> int:
        row = req * (k + 1) + len(drafts)
        h = hist[req].with_drafts(drafts)
        return int(sampler.sample(x[row:row + 1], [params[req]], [None], [h])[0])

    chain: list[list[int]] = [[], []]
    for req in range(2):
        for _ in range(k + 1):
            chain[req].append(plain(req, chain[req]))
    assert len(set(chain[0])) > 1  # the penalties changed the choice along the chain
    tokens, accepted = sampler.verify(x, [chain[0][:k], chain[1][:k]], params, [None, None],
                                      hist)
    assert tokens == chain and accepted == [k, k]
    wrong = (chain[0][1] + 1) % VOCAB
    tokens, accepted = sampler.verify(x, [[chain[0][0], wrong, 0], chain[1][:k]], params,
                                      [None, None], hist)
    assert accepted[0] == 1 and tokens[0] == [chain[0][0], plain(0, [chain[0][0]])]


def test_a_batch_without_options_never_enters_the_processors(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """Today's path for requests without options: no row bookkeeping, no processor."""
    from warmgate.server.runner.sampling import sampler as sampler_module

    def refuse(*args: object) -> None:
        raise AssertionError("the processors ran for a batch without options")
    monkeypatch.setattr(sampler_module, "apply_logits_processors", refuse)
    x, hist = _batch(2, n=4)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, top_k=3),
              SamplingParams(min_tokens=9), SamplingParams(temperature=0.0, logprobs=3)]
    Sampler().sample(x, params, [None] * 4, hist)
    Sampler().verify(x[:3], [[1], []], params[:2], [None] * 2, hist[:2])
