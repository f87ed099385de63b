"""warmup_kernels against SimpleNamespace runners: shapes, classification, caps, step plan."""

from __future__ import annotations

import pytest

from tests.warmup_fakes import Recorder, fake_runner, query_lens
from warmgate.server.runner.batch import BatchKind, classify_batch
from warmgate.server.warmup import SkipReason, warmup_kernels, warmup_shapes


@pytest.mark.parametrize("num_spec", range(17))
def test_prefill_is_prefill_and_decode_is_uniform(num_spec: int) -> None:
    runner = fake_runner(num_spec=num_spec, max_num_batched_tokens=4096)
    rec = Recorder()
    result = warmup_kernels(runner, rec.execute, rec.sample)
    assert result
    prefill, decode = rec.work_steps[0], rec.work_steps[1]
    lens, new = query_lens(prefill)
    assert set(lens) == {2 + num_spec}
    assert classify_batch(lens, 1 + num_spec, new) is BatchKind.PREFILL
    # The shape alone must not look like a uniform decode either (the runner decides on shape).
    assert classify_batch(lens, 1 + num_spec) is not BatchKind.UNIFORM_DECODE
    lens, new = query_lens(decode)
    assert classify_batch(lens, 1 + num_spec, new) is BatchKind.UNIFORM_DECODE
    assert len(lens) == warmup_shapes(runner)["num_reqs"]


@pytest.mark.parametrize(
    ("kwargs", "expected", "binding"),
    [
        # max_num_seqs binds
        (dict(max_num_seqs=3, max_num_batched_tokens=4096, num_blocks=10_000), 3, "seqs"),
        # token budget binds: 40 // max(prompt_len=2+3, decode_query_len=4) = 8
        (dict(num_spec=3, max_num_seqs=64, max_num_batched_tokens=40, num_blocks=10_000), 8,
         "tokens"),
        # KV blocks bind: decode_len = 2 + 1 = 3 tokens -> 1 block of 16; (num_blocks-1)//1
        (dict(max_num_seqs=64, max_num_batched_tokens=4096, num_blocks=6), 5, "blocks"),
        # with block_size 2 and k=1: decode_len = 3 + 2 = 5 -> 3 blocks; (50-1)//3 = 16
        (dict(num_spec=1, max_num_seqs=64, max_num_batched_tokens=4096, num_blocks=50,
              block_size=2), 16, "blocks"),
        # k=3, 40 blocks of 16: decode_len 9 -> 1 block; (40-1)//1 = 39, not 19
        (dict(num_spec=3, max_num_seqs=64, max_num_batched_tokens=4096, num_blocks=40), 39,
         "blocks"),
    ],
)
def test_num_reqs_matches_vllm_formula(kwargs: dict, expected: int, binding: str) -> None:
    runner = fake_runner(**kwargs)
    shapes = warmup_shapes(runner)
    k = kwargs.get("num_spec", 0)
    prompt_len, dql = 2 + k, 1 + k
    bs = kwargs.get("block_size", 16)
    max_blocks = -(-(prompt_len + dql) // bs)  # the seed's blocks: a prefill and one decode
    formula = min(kwargs["max_num_seqs"], kwargs["max_num_batched_tokens"] // max(prompt_len, dql),
                  max(1, (kwargs["num_blocks"] - 1) // max_blocks))
    assert shapes["num_reqs"] == formula == expected
    cap = {"seqs": "cap_max_num_seqs", "tokens": "cap_max_num_batched_tokens",
           "blocks": "cap_kv_blocks"}[binding]
    assert shapes[cap] == expected
    rec = Recorder()
    warmup_kernels(runner, rec.execute, rec.sample)
    assert len(rec.work_steps[0].scheduled_new_reqs) == expected


@pytest.mark.parametrize(("num_spec", "steps"), [(0, 3), (2, 5)])
def test_decode_step_plan(num_spec: int, steps: int) -> None:
    runner = fake_runner(num_spec=num_spec, max_num_seqs=4)
    rec = Recorder()
    result = warmup_kernels(runner, rec.execute, rec.sample)
    decode = result.phases[1]
    assert decode.name == "kernels.decode" and decode.num_steps == steps
    decode_steps = rec.work_steps[1:1 + steps]
    shapes = [query_lens(s)[0] for s in decode_steps]
    k1 = 1 + num_spec
    if num_spec:
        assert shapes == [[k1] * 4, [k1, 1], [1, 1], [k1], [1]]
        assert decode_steps[1].scheduled_spec_decode_tokens.keys() == {"_warmup_0"}
    else:
        assert shapes == [[1] * 4, [1, 1], [1]]
    # every step that scheduled tokens was sampled
    assert rec.samples == len(rec.work_steps)


def test_blocks_stay_inside_the_cache_and_avoid_the_null_block() -> None:
    runner = fake_runner(num_spec=3, max_num_seqs=64, num_blocks=30, block_size=2)
    rec = Recorder()
    warmup_kernels(runner, rec.execute, rec.sample)
    held: dict[str, list[int]] = {}
    for so in rec.steps:
        for r in so.scheduled_new_reqs:
            held[r.req_id] = list(r.block_ids[0])
        for rid, nb in zip(so.scheduled_cached_reqs.req_ids,
                           so.scheduled_cached_reqs.new_block_ids, strict=True):
            if nb:
                held[rid] += nb[0]
        for rid, n in so.num_scheduled_tokens.items():
            computed = 0
            if rid in so.scheduled_cached_reqs.req_ids:
                idx = so.scheduled_cached_reqs.req_ids.index(rid)
                computed = so.scheduled_cached_reqs.num_computed_tokens[idx]
            assert len(held[rid]) * 2 >= computed + n, "a request ran past its blocks"
        live = [b for rid in so.num_scheduled_tokens for b in held[rid]]
        assert all(0 < b < 30 for b in live)
        assert len(live) == len(set(live)), "two live requests share a block"
        for rid in so.finished_req_ids:
            held.pop(rid, None)


def test_every_request_is_finished() -> None:
    rec = Recorder()
    warmup_kernels(fake_runner(num_spec=1), rec.execute, rec.sample)
    started = {r.req_id for so in rec.steps for r in so.scheduled_new_reqs}
    finished = set().union(*(so.finished_req_ids for so in rec.steps))
    assert started == finished


def test_sampler_phase_covers_greedy_stochastic_and_seeded() -> None:
    rec = Recorder()
    result = warmup_kernels(fake_runner(max_num_seqs=3), rec.execute, rec.sample)
    assert [p.name for p in result.phases] == ["kernels.prefill", "kernels.decode",
                                               "kernels.sampler"]
    batches = [[r.sampling_params for r in so.scheduled_new_reqs] for so in rec.work_steps
               if so.scheduled_new_reqs]
    kinds = [{(p.is_greedy, p.is_seeded) for p in b} for b in batches[1:]]
    assert {(True, False)} in kinds  # all greedy
    assert {(False, False)} in kinds  # all stochastic, unseeded
    assert {(False, True)} in kinds  # all seeded
    assert {(True, False), (False, False), (False, True)} in kinds  # mixed batch


def test_pooling_model_runs_prefill_only_and_never_samples() -> None:
    rec = Recorder()
    result = warmup_kernels(fake_runner(is_pooling=True), rec.execute, rec.sample)
    assert result
    assert rec.samples == 0 and len(rec.work_steps) == 1
    assert [(p.name, p.status.value, p.skip_reason) for p in result.phases[1:]] == [
        ("kernels.decode", "SKIPPED", SkipReason.POOLING_MODEL),
        ("kernels.sampler", "SKIPPED", SkipReason.POOLING_MODEL)]
    assert all(r.sampling_params is None for r in rec.work_steps[0].scheduled_new_reqs)


def test_too_few_blocks_for_one_request_skips_without_running() -> None:
    from tests.warmup_fakes import fail_execute, fail_sample

    # decode_len = 2 + 1 = 3 tokens with block_size 1 -> 3 blocks; only 2 besides the null one.
    result = warmup_kernels(fake_runner(num_blocks=3, block_size=1), fail_execute, fail_sample)
    assert not result and result.skip_reason is SkipReason.INSUFFICIENT_KV_BLOCKS


def test_token_budget_below_one_prompt_skips() -> None:
    from tests.warmup_fakes import fail_execute, fail_sample

    result = warmup_kernels(fake_runner(num_spec=4, max_num_batched_tokens=5), fail_execute,
                            fail_sample)
    assert not result and result.skip_reason is SkipReason.TOKEN_BUDGET_TOO_SMALL
    assert "--max-num-batched-tokens" in result.detail
