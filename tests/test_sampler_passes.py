"""The sampler's passes over the vocabulary: a greedy-only batch runs the argmax alone; top-k
finds each row's best tokens with torch.topk instead of sorting the whole vocabulary, with
exactly the result of the full sort; top-k without top-p runs no nucleus pass."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from tests.runner_helpers import MiniScheduler, make_runner, prompt
from warmgate.server.runner.sampling import Sampler, SeededStream, warpers
from warmgate.server.runner.sampling.rows import TokenHistory
from warmgate.server.runner.sampling.warpers import choose_tokens, top_k_top_p
from warmgate.server.runner.scheduler_output import SamplingParams

VOCAB = 1000


def _full_sort_reference(x: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """The formulation before topk: sort every row of the whole vocabulary."""
    vocab = x.shape[-1]
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params])
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)
    sorted_x, order = x.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab)
    sorted_x = sorted_x.masked_fill(ranks[None, :] >= top_k[:, None], float("-inf"))
    p = torch.softmax(sorted_x, dim=-1)
    mass_before = p.cumsum(dim=-1) - p
    drop = (mass_before >= top_p[:, None]) & (top_p < 1.0)[:, None]
    drop[:, 0] = False
    sorted_x = sorted_x.masked_fill(drop, float("-inf"))
    return torch.empty_like(x).scatter_(-1, order, sorted_x)


def _no_sort(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("sorted the whole vocabulary")
    monkeypatch.setattr(torch.Tensor, "sort", refuse)


def test_greedy_only_batch_runs_no_warper(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a greedy-only batch computed probabilities")
    monkeypatch.setattr(warpers, "probabilities", refuse)
    _no_sort(monkeypatch)
    monkeypatch.setattr(torch.Tensor, "topk", refuse)
    x = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(0))
    # Greedy rows, even ones carrying top-k / top-p parameters.
    params = [SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.0, top_k=5, top_p=0.5)] * 2
    assert torch.equal(choose_tokens(x, params, [None] * 4), x.argmax(dim=-1))


TOP_K_BATCHES = [
    # Every sampled row has a top-k; the greedy row (no top-k) must not widen the search.
    [SamplingParams(top_k=5), SamplingParams(top_k=50, temperature=0.7),
     SamplingParams(temperature=0.0)],
    [SamplingParams(top_k=5, top_p=0.5), SamplingParams(top_k=200, top_p=0.9),
     SamplingParams(top_k=1)],
]


@pytest.mark.parametrize("params", TOP_K_BATCHES)
def test_top_k_uses_topk_and_matches_the_full_sort(params: list[SamplingParams],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(len(params), VOCAB, generator=torch.Generator().manual_seed(1)) * 3
    ref = _full_sort_reference(x, params)
    _no_sort(monkeypatch)
    got = top_k_top_p(x, params)
    for row, p in enumerate(params):
        if p.is_greedy:
            continue  # its argmax is taken from the raw logits
        assert torch.equal(got[row], ref[row]), row
        kept = int(torch.isfinite(got[row]).sum())
        assert 1 <= kept <= p.top_k


def test_without_top_k_the_whole_row_is_sorted() -> None:
    params = [SamplingParams(top_p=0.8), SamplingParams(top_k=3)]
    x = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(2))
    assert torch.equal(top_k_top_p(x, params), _full_sort_reference(x, params))


def test_top_k_without_top_p_runs_no_nucleus_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real_softmax, real_cumsum = torch.softmax, torch.Tensor.cumsum

    def softmax(*args: Any, **kwargs: Any) -> Any:
        calls.append("softmax")
        return real_softmax(*args, **kwargs)

    def cumsum(*args: Any, **kwargs: Any) -> Any:
        calls.append("cumsum")
        return real_cumsum(*args, **kwargs)
    monkeypatch.setattr(torch, "softmax", softmax)
    monkeypatch.setattr(torch.Tensor, "cumsum", cumsum)
    x = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(3))
    top_k_top_p(x, [SamplingParams(top_k=10), SamplingParams(top_k=20)])
    assert calls == []
    top_k_top_p(x, [SamplingParams(top_k=10, top_p=0.9), SamplingParams(top_k=20)])
    assert calls == ["softmax", "cumsum"]


def _mixed_params() -> list[SamplingParams]:
    return [SamplingParams(temperature=0.0),
            SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=1),
            SamplingParams(temperature=1.0, min_p=0.05, seed=2),
            SamplingParams(temperature=0.7, repetition_penalty=1.3, seed=3),
            SamplingParams(temperature=0.0, presence_penalty=0.5)]


def test_bf16_logits_sample_as_their_float32_copy() -> None:
    """compute_logits hands the sampler the model's dtype: every path must choose exactly the
    tokens the float32 copy of the same logits gives (the copy holds the same values)."""
    x = (torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(4)) * 4).bfloat16()
    params = _mixed_params()
    histories = [TokenHistory((1, 2, 3), (int(x[i].float().argmax()), 7)) for i in range(5)]
    streams = [SeededStream(p.seed, 2) if p.seed is not None else None for p in params]
    sampler = Sampler()
    got = sampler.sample(x, params, streams, histories)
    want = sampler.sample(x.float(), params, streams, histories)
    assert torch.equal(got, want)
    bitmask = torch.full((5, -(-VOCAB // 32)), -1, dtype=torch.int32)
    bitmask[:, 0] = 0  # tokens 0..31 forbidden everywhere
    if importlib.util.find_spec("xgrammar") is not None:
        got = sampler.sample(x, params, streams, histories, bitmask)
        assert torch.equal(got, sampler.sample(x.float(), params, streams, histories, bitmask))
        assert bool((got >= 32).all())


def test_a_runner_keeps_its_logits_in_the_model_dtype() -> None:
    runner = make_runner(dtype="bfloat16")
    sched = MiniScheduler(runner)
    sched.add("r", prompt(5))
    out = sched.step()
    logits = sched.logits_of("r")
    assert logits.dtype == torch.bfloat16  # no float32 copy of [rows, V] per step
    assert out is not None and out.sampled_token_ids == [[int(logits[-1].argmax())]]
