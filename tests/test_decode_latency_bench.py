"""bench/serve.py decode-latency, the parts a CPU can check: the MoE presets and --layers,
the roofline of the active parameters per batch size, and the table it prints."""

from __future__ import annotations

import pytest

from tests.bench_harness import load_script, run_bench
from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.devtools.roofline import (
    Roofline,
    expert_params,
    experts_touched,
    num_params,
)


@pytest.mark.parametrize(("preset", "batch", "expected"), [
    # E * (1 - (1 - k/E)^B): one token reads its k experts exactly; Mixtral's 2 of 8 at two
    # tokens 8 * (1 - 0.75^2) = 3.5; Qwen3's 8 of 128 at 64 tokens nearly all 128.
    ("qwen3-30b-a3b", 1, 8.0), ("mixtral-8x7b", 1, 2.0), ("mixtral-8x7b", 2, 3.5),
    ("qwen3-30b-a3b", 64, 128 * (1 - (15 / 16) ** 64)), ("llama-3.1-8b", 64, 1.0)])
def test_the_experts_a_decode_batch_touches(preset: str, batch: int, expected: float) -> None:
    assert experts_touched(ModelConfig.from_preset(preset), batch) == pytest.approx(expected)


def test_the_roofline_per_batch_counts_the_touched_experts_of_the_layers_built() -> None:
    bench = load_script("bench/lib/decode_latency.py")
    full = bench.model_config("qwen3-30b-a3b", 512, None)
    four = bench.model_config("qwen3-30b-a3b", 512, 4)
    assert (full.num_layers, four.num_layers, four.num_experts) == (48, 4, 128)
    roof = bench.roofline_ms(four, (1, 64), 512, bytes_per_s=1e12)
    assert roof[1] == pytest.approx(1000 * Roofline.of(four, 1, 512, bytes_per_s=1e12).step_s)
    # Batch 64 reads 64 streams' KV and (128 - 8) * (1 - ...) more experts per layer than 1.
    kv = 63 * 512 * 2 * 4 * 4 * 128 * 2
    experts = 4 * (experts_touched(four, 64) - 8) * expert_params(four) * 2
    assert roof[64] - roof[1] == pytest.approx(1000 * (kv + experts) / 1e12)
    assert num_params(four) < num_params(full)


def test_the_table_puts_each_step_against_its_roofline() -> None:
    bench = load_script("bench/lib/decode_latency.py")
    results = {"torch": {"eager": {1: 4.0, 64: 8.0}, "graph": {1: 2.0, 64: 6.0}},
               "triton": {"eager": {1: 3.0, 64: 8.0}, "graph": {1: 1.0, 64: 3.0}}}
    rows = bench.format_table(results, {1: 0.5, 64: 2.0}).splitlines()
    assert rows[0].split()[-2:] == ["roofline", "graph/roof"]
    assert rows[3].split() == ["triton", "1", "3.000", "1.000", "0.33", "0.75", "0.50",
                               "0.500", "2.00"]
    # Without torch among the backends the ratios to it are left out, the rest stays.
    alone = bench.format_table({"triton": results["triton"]}, {1: 0.5, 64: 2.0}).splitlines()
    assert alone[2].split() == ["triton", "64", "8.000", "3.000", "0.38", "-", "-", "2.000",
                                "1.50"]


def test_a_bench_runner_holds_and_captures_the_batches_it_is_asked_for() -> None:
    """step-kernels --batches 128 prefilled 128 requests into a runner built for the default
    sizes' 64 and stopped at the 85th for want of KV blocks (and 128 had no graph)."""
    bench = load_script("bench/lib/decode_latency.py")
    default = bench.bench_config("llama-3.2-1b", "triton", 512, 104)
    assert default.compilation.cuda_graph_sizes == (1, 8, 64)
    assert default.scheduler.max_num_seqs == 64
    wide = bench.bench_config("llama-3.2-1b", "triton", 512, 104, mixed_prompt=1024,
                              sizes=(128, 1))
    assert wide.compilation.cuda_graph_sizes == (1, 128)
    assert wide.scheduler.max_num_seqs == 128 + 1  # and the mixed step's new request
    per_req = -(-(512 + 104 + 16) // 16)
    assert wide.cache.num_blocks >= 128 * per_req + 1024 // 16


@pytest.mark.slow
def test_the_command_takes_the_moe_presets_and_refuses_a_bad_layer_count() -> None:
    ok = run_bench("bench/serve.py decode-latency",
                   ["--model", "qwen3-30b-a3b", "--layers", "2", "--help"])
    assert ok.returncode == 0 and "--layers" in ok.stdout
    bad = run_bench("bench/serve.py decode-latency", ["--model", "nope"])
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    none = run_bench("bench/serve.py decode-latency", ["--model", "mixtral-8x7b", "--layers", "0"])
    assert none.returncode == 2 and "--layers must be at least 1" in none.stderr


def test_grouped_moe_forces_the_per_slot_buckets_onto_the_grouped_gemms() -> None:
    """--grouped-moe: after the moe phase's launches, the buckets that took the per-slot
    kernels take the grouped GEMMs' launch they replaced; the others and a dense model keep
    theirs. Its rows print beside the backend's."""
    from tests.runner_helpers import make_runner
    from warmgate.server.config.moe_kernel import GEMV_MAX_TOKENS, grouped_launch
    from warmgate.server.warmup.moe_phase import run_moe_warmup

    bench = load_script("bench/lib/decode_latency.py")
    runner = make_runner(architecture="qwen3_moe", num_experts=8, num_experts_per_tok=2,
                         moe_intermediate_size=32, norm_topk_prob=True,
                         max_num_batched_tokens=64)
    run_moe_warmup(runner)
    launches = runner.model.moe_launches
    before = dict(launches.chosen)
    assert before[GEMV_MAX_TOKENS].per_slot
    forced = grouped_launch(GEMV_MAX_TOKENS, launches.shape, launches.max_tokens)
    assert bench.force_grouped_moe(runner) == f"<={GEMV_MAX_TOKENS}: {forced}"
    assert launches.chosen == {**before, GEMV_MAX_TOKENS: forced}
    assert not any(launch.per_slot for launch in launches.chosen.values())
    assert bench.force_grouped_moe(runner) == ""  # nothing per-slot is left
    assert bench.force_grouped_moe(make_runner()) == ""  # a dense model
    rows = bench.format_table({"triton": {"eager": {1: 3.0}, "graph": {1: 1.0}},
                               "triton/grouped": {"eager": {1: 3.0}, "graph": {1: 2.0}}},
                              {1: 0.5}).splitlines()
    assert rows[2].split()[:4] == ["triton/grouped", "1", "3.000", "2.000"]


@pytest.mark.parametrize("num_spec", [0, 3])
def test_a_mixed_step_runs_the_decodes_beside_a_whole_new_prompt_and_frees_it(
        num_spec: int) -> None:
    """step-kernels --mixed-prompt: each profiled step is the batch's decodes beside a new
    request's whole prompt; the request ends with its step, so its KV blocks are back for the
    next one and the steps can repeat without running out."""
    from tests.runner_helpers import make_runner
    from warmgate.server.devtools.batch_driver import BatchDriver

    bench = load_script("bench/lib/decode_latency.py")
    # 40 blocks of 4 tokens: the 3 requests grown by 6 steps (at most 34 tokens, 9 blocks
    # each) and one 20-token prompt (5 blocks), not six of them.
    driver = BatchDriver(make_runner(num_spec=num_spec, max_num_seqs=4, num_blocks=40))
    reqs = bench.prefill(driver, 3, 10, chunk=3)
    outputs = [len(r.output_token_ids) for r in reqs]
    ended: list[tuple[str, int, int]] = []  # (id, prompt tokens computed, tokens sampled)
    finish = driver.finish

    def recording(req_id: str) -> None:
        req = driver.reqs[req_id]
        ended.append((req_id, req.num_computed_tokens, len(req.output_token_ids)))
        finish(req_id)

    driver.finish = recording  # type: ignore[method-assign]
    for i in range(6):
        assert bench.mixed_s(driver, reqs, 20, f"new{i}") > 0
        assert f"new{i}" not in driver.reqs
    # Each new prompt whole in its one step, its first token sampled.
    assert ended == [(f"new{i}", 20, 1) for i in range(6)]
    # Every decode advanced by a token a step at least (k drafts may add more).
    assert all(len(r.output_token_ids) >= n + 6 for r, n in zip(reqs, outputs, strict=True))
    assert all(r.num_computed_tokens >= 10 + 6 for r in reqs)
