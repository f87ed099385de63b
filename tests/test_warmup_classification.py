"""Issue 16 item 1: no prefill step of the warmup plan is ever classified as a uniform
decode, for k = 0..4, in every phase; decided by whether a request is still prefilling,
not by the batch's shape (a 2-token prefill has a decode's shape at k = 1)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.runner_helpers import make_runner
from warmgate.server.runner.batch import BatchKind, classify_batch, is_uniform_decode
from warmgate.server.warmup import run_warmup_plan


def _spy_steps(runner: Any) -> list[tuple[bool, bool, str, bool]]:
    """Per step: (a request is reading its prompt, meta.is_uniform_decode, monitor's kind,
    every request has the decode query length)."""
    seen: list[tuple[bool, bool, str, bool]] = []
    prepare = runner.input_batch.prepare_inputs
    batch_shape = runner._batch_shape

    def spy_prepare(scheduled: list[Any], shape_for: Any = None) -> Any:
        inputs = prepare(scheduled, shape_for)
        prefill = any(s.num_computed_tokens < s.state.num_prompt_tokens for s in scheduled)
        decode_len = all(s.num_scheduled_tokens == runner.decode_query_len for s in scheduled)
        seen.append((prefill, inputs.meta.is_uniform_decode, "", decode_len))
        return inputs

    def spy_shape(inputs: Any) -> Any:
        shape = batch_shape(inputs)
        prefill, uniform, _, decode_len = seen[-1]
        seen[-1] = (prefill, uniform, shape.kind, decode_len)
        return shape

    runner.input_batch.prepare_inputs = spy_prepare
    runner._batch_shape = spy_shape
    return seen


@pytest.mark.parametrize("num_spec", range(5))
def test_no_prefill_step_is_classified_uniform_decode(num_spec: int) -> None:
    runner = make_runner(num_spec=num_spec, max_num_seqs=4, max_num_batched_tokens=64)
    steps = _spy_steps(runner)
    report = run_warmup_plan(runner)
    assert report.succeeded, report
    prefill_steps = [s for s in steps if s[0]]
    assert prefill_steps and any(not s[0] and s[1] for s in steps)  # both kinds occurred
    assert [s for s in prefill_steps if s[1]] == [], "a prefill step took the uniform path"
    assert all(s[2] != BatchKind.UNIFORM_DECODE.value for s in prefill_steps)


@pytest.mark.parametrize("num_spec", [0, 3])
def test_every_decode_shaped_step_is_uniform_even_after_a_restatement(num_spec: int) -> None:
    # max_model_len 16 makes the decode phase restate request 0 to its prompt length.
    runner = make_runner(num_spec=num_spec, max_num_seqs=4, max_num_batched_tokens=64,
                         max_model_len=16, block_size=16)
    steps = _spy_steps(runner)
    report = run_warmup_plan(runner)
    assert report.succeeded
    assert num_spec == 0 or report.phase("kernels.decode").shapes["restated_requests"] >= 1
    for prefill, uniform, kind, decode_len in steps:
        assert uniform == (not prefill and decode_len)
        assert (kind == BatchKind.UNIFORM_DECODE.value) == uniform


def test_two_token_prefill_at_k1_is_not_uniform() -> None:
    # The mixed phase's first step at k = 1: one request, 2 prompt tokens, decode length 2.
    assert not is_uniform_decode(2, 1, 2, 2, any_prefill=True)
    assert is_uniform_decode(2, 1, 2, 2, any_prefill=False)
    assert classify_batch([2], 2, [True]) is BatchKind.PREFILL
    assert classify_batch([2], 2, [False]) is BatchKind.UNIFORM_DECODE
