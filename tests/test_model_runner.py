"""The runner's contract: vLLM attribute names, start-up checks, pooling, input validation."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from tests.runner_helpers import MiniScheduler, make_runner, prompt, tiny_config
from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.runner import ModelRunner, build_runner
from warmgate.server.runner.kv_cache import FullAttentionSpec, KVCacheAllocationError
from warmgate.server.runner.scheduler_output import SchedulerOutput
from warmgate.server.warmup.steps import new_request, scheduler_output


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return make_runner(num_spec=2, max_num_seqs=4, max_num_batched_tokens=64, num_blocks=40)


def test_vllm_attribute_contract(runner: ModelRunner) -> None:
    assert runner.num_speculative_steps == 2
    assert runner.decode_query_len == 3
    assert runner.max_num_reqs == 4
    assert runner.is_pooling_model is False
    assert runner.scheduler_config.max_num_seqs == 4
    assert runner.scheduler_config.max_num_batched_tokens == 64
    assert runner.kv_cache_config.num_blocks == 40
    assert runner.kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size == 4
    assert runner.device == torch.device("cpu") and runner.dtype == torch.float32
    assert runner.attention_backend.name == "torch"
    assert len(runner.kv_caches) == 2
    assert runner.kv_caches[0].shape == (2, 40, 4, 2, 16)
    stats = runner.load_stats
    assert stats.weights_s >= 0 and stats.kv_cache_s >= 0 and stats.weights_source == "random"
    assert stats.kv_cache_bytes == 2 * 40 * 2 * 4 * 2 * 16 * 4
    assert runner.input_batch.staging.views(1, 4).block_table.gpu.shape == (4, 32)  # 128 / 4


def test_unresolved_config_is_refused() -> None:
    with pytest.raises(ValueError, match="resolve_runner_config"):
        ModelRunner(RunnerConfig())


def test_build_runner_resolves() -> None:
    r = build_runner(dataclasses.replace(RunnerConfig(), device=tiny_config().device))
    assert r.config.is_resolved and r.attention_backend.name == "torch"
    # auto block count: max_num_seqs full-length requests plus the null block.
    assert r.kv_cache_config.num_blocks == 8 * (512 // 16) + 1


def test_kv_cache_oom_names_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    def oom(*args: object, **kwargs: object) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(torch, "zeros", oom)
    from warmgate.server.runner.kv_cache import allocate_kv_cache

    with pytest.raises(KVCacheAllocationError, match=r"cache\.num_blocks.*--num-blocks.*"
                                                      r"max_model_len.*max_num_seqs"):
        allocate_kv_cache(2, 10, FullAttentionSpec(4, 2, 16), torch.device("cpu"))


def test_pooling_model_returns_normalised_embeddings() -> None:
    runner = make_runner(pooling=True)
    assert runner.is_pooling_model and runner.model.lm_head is None
    sched = MiniScheduler(runner)
    sched.add("e1", prompt(6))
    sched.add("e2", prompt(9, offset=3))
    so = sched.schedule(num_tokens={"e1": 6, "e2": 4})
    out = runner.execute_model(so)
    assert out is not None and out.req_ids == ["e1", "e2"]
    assert out.pooler_output is not None and out.pooler_output[1] is None  # mid-prompt
    e1 = out.pooler_output[0]
    assert isinstance(e1, torch.Tensor) and e1.shape == (64,)
    torch.testing.assert_close(e1.norm(), torch.tensor(1.0))
    assert runner.sample_tokens(None) is None
    sched.update(out)
    out = runner.execute_model(sched.schedule(num_tokens={"e2": 5}))
    assert out is not None and out.pooler_output is not None
    assert isinstance(out.pooler_output[0], torch.Tensor)
    assert not torch.allclose(out.pooler_output[0], e1)
    assert runner.sample_tokens(None) is None


def test_sample_tokens_without_a_step_returns_none(runner: ModelRunner) -> None:
    assert runner.sample_tokens(None) is None


def test_execute_twice_without_sampling_is_refused() -> None:
    r = make_runner()
    r.execute_model(scheduler_output(new_reqs=[new_request("x", [1, 2], ([1],), None)],
                                     num_scheduled={"x": 2}))
    with pytest.raises(RuntimeError, match="sample_tokens"):
        r.execute_model(scheduler_output(finished={"x"}))


def _new(rid: str = "r", n: int = 4, blocks: list[int] | None = None) -> SchedulerOutput:
    return scheduler_output(new_reqs=[new_request(rid, prompt(n), (blocks or [1, 2],), None)],
                            num_scheduled={rid: n})


def _bad_total(so: SchedulerOutput) -> SchedulerOutput:
    so.total_num_scheduled_tokens += 1
    return so


BAD_OUTPUTS: list[tuple[str, Callable[[], SchedulerOutput]]] = [
    ("unknown to the runner", lambda: scheduler_output(cached=[("ghost", 3, None)],
                                                       num_scheduled={"ghost": 1})),
    ("block id 40 is out of range", lambda: _new(blocks=[1, 40])),
    ("block id 0 is out of range", lambda: _new(blocks=[0, 1])),
    ("over scheduler.max_num_batched_tokens", lambda: _new(n=65, blocks=list(range(1, 18)))),
    ("over max_num_reqs", lambda: scheduler_output(
        new_reqs=[new_request(f"q{i}", [1], ([i + 1],), None) for i in range(5)],
        num_scheduled={f"q{i}": 1 for i in range(5)})),
    ("over max_model_len", lambda: scheduler_output(
        new_reqs=[new_request("long", prompt(130), (list(range(1, 34)),), None)],
        num_scheduled={"long": 60})),
    ("need 2 blocks", lambda: _new(n=6, blocks=[1])),
    ("outside the vocabulary", lambda: scheduler_output(
        new_reqs=[new_request("v", [1, 9999], ([1],), None)], num_scheduled={"v": 2})),
    ("total_num_scheduled_tokens", lambda: _bad_total(_new())),
    ("at least one non-draft token", lambda: scheduler_output(
        new_reqs=[new_request("d", [1, 2], ([1],), None)], num_scheduled={"d": 2},
        spec_tokens={"d": [1, 2]})),
    ("missing from num_scheduled_tokens", lambda: scheduler_output(
        new_reqs=[new_request("m", [1, 2], ([1],), None)], num_scheduled={})),
]


@pytest.mark.parametrize(("message", "build"), BAD_OUTPUTS, ids=[m for m, _ in BAD_OUTPUTS])
def test_bad_scheduler_outputs_are_rejected(runner: ModelRunner, message: str,
                                            build: Callable[[], SchedulerOutput]) -> None:
    held = dict(runner.input_batch.requests)
    with pytest.raises(ValueError, match=message):
        runner.execute_model(build())
    assert runner.input_batch.requests == held  # nothing was applied


def test_over_max_model_len_across_steps(runner: ModelRunner) -> None:
    so = scheduler_output(new_reqs=[new_request("w", prompt(8), ([1, 2],), None)],
                          num_scheduled={"w": 8})
    runner.execute_model(so)
    runner.sample_tokens(None)
    with pytest.raises(ValueError, match="over max_model_len"):
        runner.execute_model(scheduler_output(cached=[("w", 127, [list(range(3, 35))])],
                                              num_scheduled={"w": 3}))
    with pytest.raises(ValueError, match="already held"):
        runner.execute_model(so)
    runner.execute_model(scheduler_output(finished={"w"}))
    assert "w" not in runner.input_batch.requests


def test_a_request_finished_in_a_step_is_gone_for_that_step(runner: ModelRunner) -> None:
    """Finished requests are dropped before the step's own are checked: one finished and
    scheduled again as new in the same step is accepted, as a cached one it is unknown."""
    first = scheduler_output(new_reqs=[new_request("x", prompt(4), ([1],), None)],
                             num_scheduled={"x": 4})
    runner.execute_model(first)
    runner.sample_tokens(None)
    with pytest.raises(ValueError, match="unknown to the runner"):
        runner.execute_model(scheduler_output(cached=[("x", 4, None)], num_scheduled={"x": 1},
                                              finished={"x"}))
    again = scheduler_output(new_reqs=[new_request("x", prompt(4), ([2],), None)],
                             num_scheduled={"x": 4}, finished={"x"})
    runner.execute_model(again)
    runner.sample_tokens(None)
    assert runner.input_batch.requests["x"].block_ids == [2]
    runner.execute_model(scheduler_output(finished={"x"}))
