"""The ragged-batch CUDA graphs' token buckets (runner/compile_buckets.py ragged_buckets): past
FINE_FROM tokens a step's projections are compute-bound, so every step beside decodes pads by
at most an eighth; steps of prompts alone above that keep powers of two."""

from __future__ import annotations

import dataclasses

import pytest

from tests.runner_helpers import make_runner
from warmgate.server.config.compilation_config import default_cuda_graph_sizes
from warmgate.server.runner.compile_buckets import (
    FINE_FROM,
    bucket_for,
    compile_buckets,
    ragged_buckets,
)


def _padding(buckets: tuple[int, ...], tokens: int) -> float:
    return bucket_for(buckets, tokens) / tokens - 1


def test_the_8b_closed_loops_mixed_steps_pad_by_an_eighth_at_most() -> None:
    # 128 streams, a budget of 8,192 and the default bound of 1,024 prompt tokens a step
    # while streams decode: a step beside decodes holds up to 1,024 + 128 tokens.
    sizes = default_cuda_graph_sizes(128)
    buckets = ragged_buckets(sizes, 1, 8192, 1024 + 128)
    assert bucket_for(buckets, 1024 + 128) == 1152  # the powers of two gave 2,048
    assert bucket_for(compile_buckets(sizes, 1, 8192), 1152) == 2048
    assert max(_padding(buckets, n) for n in range(FINE_FROM, 1153)) <= 1 / 8
    # Below FINE_FROM and above the mixed steps: the compile buckets' powers of two.
    assert [b for b in buckets if b <= FINE_FROM] == [
        b for b in compile_buckets(sizes, 1, 8192) if b <= FINE_FROM]
    assert [b for b in buckets if b > 1152] == [2048, 4096, 8192]


def test_without_a_bound_every_step_past_fine_from_pads_by_an_eighth_at_most() -> None:
    buckets = ragged_buckets((1, 2, 4, 8), 4, 3000, 3000)
    assert max(_padding(buckets, n) for n in range(FINE_FROM, 3001)) <= 1 / 8
    assert buckets[-1] == 3000 and bucket_for(buckets, 2900) == 3000


def test_a_bound_under_fine_from_keeps_the_compile_buckets() -> None:
    # Steps beside decodes fit 256 tokens: the prompt-only steps above keep powers of two.
    sizes = (1, 2, 4, 8)
    assert ragged_buckets(sizes, 1, 4096, 200) == compile_buckets(sizes, 1, 4096)


@pytest.mark.parametrize(("budget", "mixed"), [(64, 64), (512, 1040), (300, 200)])
def test_small_budgets_keep_the_budget_as_the_last_bucket(budget: int, mixed: int) -> None:
    buckets = ragged_buckets((1, 2, 4, 8), 1, budget, mixed)
    assert buckets[-1] == budget and all(b <= budget for b in buckets)
    assert buckets == tuple(sorted(set(buckets)))


def test_the_runner_bounds_its_fine_buckets_by_the_prompt_bound_while_decoding() -> None:
    runner = make_runner(attention_backend="triton", max_num_seqs=8,
                         max_num_batched_tokens=4096)
    bound = runner.config.scheduler.max_prefill_tokens_while_decoding
    assert bound == 1024
    assert runner.ragged_graph_buckets() == ragged_buckets(
        runner.config.compilation.cuda_graph_sizes, 1, 4096, bound + 8)
    unbounded = make_runner(attention_backend="triton", max_num_seqs=8,
                            max_num_batched_tokens=4096)
    unbounded.config = dataclasses.replace(unbounded.config, scheduler=dataclasses.replace(
        unbounded.config.scheduler, max_prefill_tokens_while_decoding=0))
    fine = unbounded.ragged_graph_buckets()
    assert max(_padding(fine, n) for n in range(FINE_FROM, 4097)) <= 1 / 8
    assert len(fine) > len(runner.ragged_graph_buckets())
