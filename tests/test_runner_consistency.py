"""The paged KV cache must not change the numbers: however a sequence is split into steps
(token-by-token decode, chunked prefill, batched with other requests), its logits equal those
of one full prefill over the same tokens at the same positions."""

from __future__ import annotations

import pytest
import torch

from tests.runner_helpers import (
    MiniScheduler,
    full_prefill_logits,
    make_runner,
    prompt,
    record_uniform_flags,
)
from warmgate.server.runner.model_runner import ModelRunner

ATOL = 1e-4


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return make_runner()


def test_logits_are_not_degenerate(runner: ModelRunner) -> None:
    # A meaningful atol needs logits of order one, not a near-zero random init.
    logits = full_prefill_logits(runner, prompt(9))
    assert 0.3 < logits.std().item() < 10.0


def test_decode_token_by_token_matches_full_prefill(runner: ModelRunner,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    sched = MiniScheduler(runner)
    p = prompt(9, offset=3)
    sched.add("a", p)
    sched.step()
    step_logits = [sched.logits_of("a")[-1].clone()]
    flags = record_uniform_flags(runner, monkeypatch)
    for _ in range(6):
        sched.step()
        step_logits.append(sched.logits_of("a")[-1].clone())
    # One-token decodes of one request are uniform decodes: the graph-capturable path.
    assert flags == [True] * 6
    generated = sched.tokens("a")
    assert len(generated) == 7
    for j, logits in enumerate(step_logits):
        reference = full_prefill_logits(runner, p + generated[:j])
        torch.testing.assert_close(logits, reference, atol=ATOL, rtol=0)
        assert int(logits.argmax()) == generated[j]


def test_chunked_prefill_matches_full_prefill(runner: ModelRunner) -> None:
    sched = MiniScheduler(runner)
    p = prompt(11, offset=5)
    sched.add("c", p)
    first = sched.step(num_tokens={"c": 6})
    assert first is not None and first.sampled_token_ids == [[]]
    assert runner.last_logits is not None and runner.last_logits.shape[0] == 0
    sched.step(num_tokens={"c": 5})
    torch.testing.assert_close(sched.logits_of("c")[-1], full_prefill_logits(runner, p),
                               atol=ATOL, rtol=0)


def test_three_chunks_then_decode(runner: ModelRunner) -> None:
    sched = MiniScheduler(runner)
    p = prompt(10, offset=8)
    sched.add("t", p)
    for n in (3, 4, 3):
        sched.step(num_tokens={"t": n})
    sched.step()
    got = sched.logits_of("t")[-1].clone()
    reference = full_prefill_logits(runner, [*p, sched.tokens("t")[0]])
    torch.testing.assert_close(got, reference, atol=ATOL, rtol=0)


def test_mixed_batch_matches_each_request_alone(runner: ModelRunner,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    alone: dict[str, torch.Tensor] = {}
    batched = MiniScheduler(runner)
    pa, pb, pc = prompt(7, offset=1), prompt(5, offset=2), prompt(12, offset=4)
    batched.add("dec", pa)
    batched.add("dec2", pb)
    batched.step()  # both prefilled together
    batched.add("pre", pc)
    flags = record_uniform_flags(runner, monkeypatch)
    # One step: two decodes and a chunk that reaches the end of a 12-token prompt.
    out = batched.step()
    assert out is not None
    assert runner.last_logits_req_ids == ["dec", "dec2", "pre"]
    assert flags == [False]
    got = {rid: batched.logits_of(rid)[-1].clone() for rid in ("dec", "dec2", "pre")}
    alone["dec"] = full_prefill_logits(runner, [*pa, batched.tokens("dec")[0]])
    alone["dec2"] = full_prefill_logits(runner, [*pb, batched.tokens("dec2")[0]])
    alone["pre"] = full_prefill_logits(runner, pc)
    for rid, reference in alone.items():
        torch.testing.assert_close(got[rid], reference, atol=ATOL, rtol=0)


def test_mixed_batch_with_a_mid_prefill_chunk(runner: ModelRunner) -> None:
    sched = MiniScheduler(runner)
    pa, pb = prompt(6, offset=9), prompt(14, offset=10)
    sched.add("d", pa)
    sched.step()
    sched.add("p", pb)
    out = sched.step(num_tokens={"d": 1, "p": 8})  # "p" is still mid-prompt
    assert out is not None
    assert out.sampled_token_ids[1] == [] and len(out.sampled_token_ids[0]) == 1
    assert runner.last_logits_req_ids == ["d"]
    sched.step(num_tokens={"d": 1, "p": 6})
    got_p, got_d = sched.logits_of("p")[-1].clone(), sched.logits_of("d")[-1].clone()
    torch.testing.assert_close(got_p, full_prefill_logits(runner, pb), atol=ATOL, rtol=0)
    reference = full_prefill_logits(runner, pa + sched.tokens("d")[:2])
    torch.testing.assert_close(got_d, reference, atol=ATOL, rtol=0)


def test_uniform_decode_of_several_requests(runner: ModelRunner,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    sched = MiniScheduler(runner)
    prompts = {f"u{i}": prompt(4 + 3 * i, offset=20 + i) for i in range(4)}
    for rid, p in prompts.items():
        sched.add(rid, p)
    sched.step()
    flags = record_uniform_flags(runner, monkeypatch)
    for _ in range(3):
        sched.step()
    assert flags == [True] * 3
    got = {rid: sched.logits_of(rid)[-1].clone() for rid in prompts}
    for rid, p in prompts.items():
        reference = full_prefill_logits(runner, p + sched.tokens(rid)[:3])
        torch.testing.assert_close(got[rid], reference, atol=ATOL, rtol=0)


def test_finished_requests_are_dropped(runner: ModelRunner) -> None:
    sched = MiniScheduler(runner)
    sched.add("f", prompt(5))
    sched.step()
    assert "f" in runner.input_batch.requests
    sched.finish("f")
    assert runner.execute_model(sched.schedule(num_tokens={})) is None
    assert "f" not in runner.input_batch.requests
    assert runner.sample_tokens(None) is None
