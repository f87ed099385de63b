"""Eager batches padded to the token granule (what a CUDA runner does, forced here on the CPU):
the padding tokens belong to no request, so the logits and every request's KV entries are
those of the unpadded runner, and only the null block takes the padding's writes."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
import torch

from tests.runner_helpers import MiniScheduler, make_runner, prompt
from warmgate.server.runner.eager_tokens import EAGER_TOKEN_GRANULE
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.scheduler_output import GREEDY, TokenLogprobs


def traffic(runner: ModelRunner, num_spec: int, seen: list[int]) -> list[torch.Tensor]:
    """Mixed prefill chunks and decodes with drafts; every step's logits, and the token count
    of every eager forward in `seen`."""
    forward = runner._eager_forward

    def counting(ids: torch.Tensor, pos: torch.Tensor, meta: object) -> torch.Tensor:
        seen.append(ids.shape[0])
        return forward(ids, pos, meta)  # type: ignore[arg-type]

    runner._eager_forward = counting  # type: ignore[method-assign]
    sched = MiniScheduler(runner)
    rng = random.Random(3)
    logits: list[torch.Tensor] = []
    ids = [f"r{i}" for i in range(5)]
    for i, rid in enumerate(ids):
        sched.add(rid, prompt(rng.randint(3, 37), offset=i))
    for _ in range(14):
        left = {rid: max(0, sched.reqs[rid].remaining_prompt) for rid in ids}
        sched.step({rid: min(n, rng.randint(1, 9)) if n else 1 + num_spec
                    for rid, n in left.items()},
                   drafts={rid: [7] * num_spec for rid, n in left.items() if not n})
        assert runner.last_logits is not None
        logits.append(runner.last_logits.clone())
    return logits


@pytest.mark.parametrize("num_spec", [0, 2])
def test_padded_eager_batches_change_nothing_a_request_sees(num_spec: int) -> None:
    plain = make_runner(num_spec=num_spec)
    padded = make_runner(num_spec=num_spec)
    padded.eager_granule = EAGER_TOKEN_GRANULE
    plain_counts: list[int] = []
    padded_counts: list[int] = []
    expected = traffic(plain, num_spec, plain_counts)
    got = traffic(padded, num_spec, padded_counts)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # Some batches were padded (not uniform decodes), to a multiple of the granule.
    assert any(n % EAGER_TOKEN_GRANULE for n in plain_counts)
    assert all(n % EAGER_TOKEN_GRANULE == 0 or n in plain_counts for n in padded_counts)
    assert set(padded_counts) - set(plain_counts)
    # The KV caches agree outside block 0, the null block the padding writes to.
    for kv_padded, kv_plain in zip(padded.kv_caches, plain.kv_caches, strict=True):
        torch.testing.assert_close(kv_padded[:, 1:], kv_plain[:, 1:], rtol=1e-5, atol=1e-5)


def test_the_forward_returns_the_steps_own_rows_only() -> None:
    """_run_model's contract, [T, H] for the step's T tokens, holds for a padded batch."""
    runner = make_runner()
    runner.eager_granule = EAGER_TOKEN_GRANULE
    shapes: list[tuple[int, int]] = []
    run_model = runner._run_model

    def spy(inputs: Any) -> torch.Tensor:
        hidden = run_model(inputs)
        shapes.append((inputs.input_ids.shape[0], hidden.shape[0]))
        return hidden

    runner._run_model = spy  # type: ignore[method-assign]
    sched = MiniScheduler(runner)
    sched.add("a", prompt(5))
    sched.step()
    assert shapes == [(5, 5)]


def test_a_uniform_decode_is_not_padded() -> None:
    runner = make_runner()
    runner.eager_granule = EAGER_TOKEN_GRANULE
    seen: list[int] = []
    sched = MiniScheduler(runner)
    for i in range(3):
        sched.add(f"d{i}", prompt(5, offset=i))
    forward = runner._eager_forward
    runner._eager_forward = (  # type: ignore[method-assign]
        lambda ids, pos, meta: (seen.append(ids.shape[0]), forward(ids, pos, meta))[1])
    sched.step()  # the prompts: padded to the granule
    sched.step()  # 3 requests x 1 token: a uniform decode, as it is
    assert seen == [EAGER_TOKEN_GRANULE, 3]


def _prompt_outputs(runner: ModelRunner, pooling: bool) -> list[object]:
    """Prompt logprobs (generative) or pooled embeddings (pooling) of three prompts prefilled
    in chunks: the outputs that read the step's hidden rows by position, not by logits row."""
    sched = MiniScheduler(runner)
    params = None if pooling else replace(GREEDY, prompt_logprobs=3)
    for i, n in enumerate((5, 19, 30)):
        sched.add(f"p{i}", prompt(n, offset=i), params)
    outputs: list[object] = []
    for _ in range(4):
        left = {rid: max(0, r.remaining_prompt) for rid, r in sched.reqs.items()}
        if not any(left.values()):
            break
        out = sched.step({rid: min(n, 11) or 1 for rid, n in left.items()})
        assert out is not None
        outputs.append(out.pooler_output if pooling else out.prompt_logprobs)
    return outputs


@pytest.mark.parametrize("pooling", [False, True])
def test_prompt_logprobs_and_pooling_read_only_the_requests_rows(pooling: bool) -> None:
    plain, padded = make_runner(pooling=pooling), make_runner(pooling=pooling)
    padded.eager_granule = EAGER_TOKEN_GRANULE
    expected, got = _prompt_outputs(plain, pooling), _prompt_outputs(padded, pooling)
    assert len(got) == len(expected) > 1
    for a, b in zip(got, expected, strict=True):
        assert repr(a)[:40] == repr(b)[:40]
        if pooling:
            for x, y in zip(a, b, strict=True):  # type: ignore[call-overload]
                assert (x is None) == (y is None)
                if x is not None:
                    torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
        else:
            assert a.keys() == b.keys()  # type: ignore[attr-defined]
            for rid in a:  # type: ignore[attr-defined]
                _same_logprobs(a[rid].entries, b[rid].entries)  # type: ignore[index]


def _same_logprobs(got: list[TokenLogprobs], expected: list[TokenLogprobs]) -> None:
    """The same tokens, ranks and top ids; logprobs to float32 GEMM rounding."""
    assert len(got) == len(expected) > 0
    for x, y in zip(got, expected, strict=True):
        assert (x.token_id, x.rank, [t for t, _ in x.top]) == (
            y.token_id, y.rank, [t for t, _ in y.top])
        assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
