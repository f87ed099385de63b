"""run_mixed_prefill_decode_warmup: the gates touch nothing; the mixed step has the right shape."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from tests.warmup_fakes import Recorder, fail_execute, fail_sample, fake_runner, query_lens
from warmgate.server.runner.batch import BatchKind, classify_batch
from warmgate.server.warmup import SkipReason, run_mixed_prefill_decode_warmup


@pytest.mark.parametrize("max_num_reqs", [0, 1])
def test_skips_when_max_num_reqs_below_two(max_num_reqs: int) -> None:
    # Only the attributes the gate may read exist: reading anything else raises.
    runner = SimpleNamespace(is_pooling_model=False, max_num_reqs=max_num_reqs)
    result = run_mixed_prefill_decode_warmup(runner, fail_execute, fail_sample, 16)
    assert not result
    assert result.skip_reason is SkipReason.MAX_NUM_REQS_LT_2
    assert result.phases[0].status.value == "SKIPPED"


@pytest.mark.parametrize("num_tokens", [0, 1, 2])
def test_skips_when_num_tokens_below_three(num_tokens: int) -> None:
    runner = SimpleNamespace(is_pooling_model=False, max_num_reqs=8)
    result = run_mixed_prefill_decode_warmup(runner, fail_execute, fail_sample, num_tokens)
    assert not result and result.skip_reason is SkipReason.NUM_TOKENS_LT_3


def test_skips_pooling_model_before_reading_anything_else() -> None:
    runner = SimpleNamespace(is_pooling_model=True)
    result = run_mixed_prefill_decode_warmup(runner, fail_execute, fail_sample, 16)
    assert not result and result.skip_reason is SkipReason.POOLING_MODEL


def test_skips_with_too_few_kv_blocks() -> None:
    # 16 tokens: the decode request needs 1 block of 16, the 15-token prefill 1: 2 > 1.
    runner = fake_runner(num_blocks=2)
    result = run_mixed_prefill_decode_warmup(runner, fail_execute, fail_sample, 16)
    assert not result and result.skip_reason is SkipReason.INSUFFICIENT_KV_BLOCKS
    assert "--num-blocks" in result.detail


def test_skips_when_num_tokens_exceeds_the_budget() -> None:
    runner = fake_runner(max_num_batched_tokens=8)
    result = run_mixed_prefill_decode_warmup(runner, fail_execute, fail_sample, 9)
    assert not result and result.skip_reason is SkipReason.TOKEN_BUDGET_TOO_SMALL


@pytest.mark.parametrize("num_tokens", [3, 16, 40])
def test_runs_a_two_token_prefill_then_one_mixed_step(num_tokens: int) -> None:
    rec = Recorder()
    entered: list[str] = []

    @contextmanager
    def ctx():  # type: ignore[no-untyped-def]
        entered.append("in")
        yield
        entered.append("out")

    result = run_mixed_prefill_decode_warmup(fake_runner(block_size=4), rec.execute, rec.sample,
                                             num_tokens, mixed_step_context=ctx(),
                                             req_id_prefix="probe")
    assert result and result.phases[0].num_tokens == num_tokens
    first, mixed = rec.work_steps
    assert query_lens(first)[0] == [2]
    lens, new = query_lens(mixed)
    assert sorted(lens) == sorted([1, num_tokens - 1]) and sum(lens) == num_tokens
    assert classify_batch(lens, 1, new) is BatchKind.MIXED
    assert mixed.scheduled_cached_reqs.num_computed_tokens == [2]
    assert all(r.startswith("probe") for r in mixed.num_scheduled_tokens)
    assert entered == ["in", "out"]
    assert rec.steps[-1].finished_req_ids == set(mixed.num_scheduled_tokens)
    assert rec.samples == 2
