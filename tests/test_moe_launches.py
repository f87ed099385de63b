"""The fused MoE kernel's launch per token-count bucket: the table fitted to the expert shape,
the autotune (with a fake timer: the CPU has nothing to time), the compile cache entry that
keeps its winners for a warm start, the "autotune" JIT event after ready, and the expert
shapes the kernel refuses at load."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from warmgate.server.config.moe_kernel import (
    GEMV_ELEMENTS_PER_THREAD,
    GEMV_MAX_TOKENS,
    LAUNCH_TABLE,
    MAX_EXPERTS,
    MAX_TILE_ELEMENTS,
    ExpertShape,
    MoELaunch,
    bucket_of,
    buckets_up_to,
    candidates,
    check_moe_kernel_shape,
    table_launch,
)
from warmgate.server.config.runner_config import ConfigError, ModelConfig, RunnerConfig
from warmgate.server.config.startup_checks import check_moe_kernel
from warmgate.server.jit import JitMonitor, StrictJitPolicy
from warmgate.server.jit.events import AUTOTUNE
from warmgate.server.runner.moe import MoEBlock
from warmgate.server.runner.moe_launches import MoELaunches
from warmgate.server.telemetry.metrics import COMPILE_KINDS, Metrics

QWEN3_30B = ExpertShape(num_experts=128, top_k=8, hidden_size=2048, intermediate_size=768)
MIXTRAL = ExpertShape(num_experts=8, top_k=2, hidden_size=4096, intermediate_size=14336)


def test_buckets_cover_every_token_count_in_order() -> None:
    assert bucket_of(1) == bucket_of(GEMV_MAX_TOKENS) == GEMV_MAX_TOKENS
    assert bucket_of(GEMV_MAX_TOKENS + 1) == bucket_of(32) == 32 and bucket_of(33) == 256
    assert bucket_of(10**9) == LAUNCH_TABLE[-1][0]
    assert buckets_up_to(1) == (2,) and buckets_up_to(300) == (2, 32, 256, 2048)


def test_the_table_is_fitted_to_the_expert_shape() -> None:
    # 256 tokens x top-8 over 128 experts: 16 rows per expert, so a 32-row tile is half
    # padding; Mixtral's 2 of 8 expect 64 rows there, and keep the table's 32.
    assert table_launch(256, QWEN3_30B).block_m == 16
    assert table_launch(256, MIXTRAL) == dict(LAUNCH_TABLE)[256]
    # The token budget caps the open-ended last bucket's rows.
    assert table_launch(LAUNCH_TABLE[-1][0], QWEN3_30B, max_tokens=4096).block_m == 128
    assert table_launch(LAUNCH_TABLE[-1][0], QWEN3_30B, max_tokens=2049).block_m == 128
    # GEMMs narrower than the table's tiles get tiles no wider than they are (at least 16).
    narrow = ExpertShape(num_experts=4, top_k=2, hidden_size=48, intermediate_size=32)
    launch = table_launch(2048, narrow)
    assert (launch.block_n, launch.block_k) == (32, 32)
    for bucket, _ in LAUNCH_TABLE:
        found = candidates(bucket, QWEN3_30B, max_tokens=8192)
        assert found[0] == table_launch(bucket, QWEN3_30B, max_tokens=8192)
        assert len(found) == len(set(found)) >= 4
        grouped = [c for c in found if not c.per_slot]
        assert all(min(c.block_m, c.block_n, c.block_k) >= 16 for c in grouped)
        # Two float32 accumulators of BLOCK_M x BLOCK_N must fit the registers.
        assert all(c.block_m * c.block_n <= MAX_TILE_ELEMENTS for c in grouped)
        # The per-slot kernels' two of BLOCK_N x BLOCK_K likewise, over the warps' threads.
        assert all(c.block_n * c.block_k <= GEMV_ELEMENTS_PER_THREAD * 32 * c.num_warps
                   for c in found if c.per_slot)
    # The per-slot bucket's include the grouped GEMMs' launch, last.
    small = candidates(GEMV_MAX_TOKENS, QWEN3_30B)
    assert small[0].per_slot and not small[-1].per_slot
    assert [c.per_slot for c in small].count(False) == 1
    assert MoELaunch(256, 128, 64, 8, 3) not in candidates(LAUNCH_TABLE[-1][0], MIXTRAL)


class FakeTimer:
    """Times a candidate as its BLOCK_M's distance from `best_m` (the CPU has no device to
    time on); remembers every call."""

    def __init__(self, best_m: int = 32) -> None:
        self.best_m = best_m
        self.calls: list[tuple[MoELaunch, int]] = []

    def __call__(self, launch: MoELaunch, num_tokens: int) -> float:
        self.calls.append((launch, num_tokens))
        return 1e-5 * (1 + abs(launch.block_m - self.best_m)) + 1e-9 * launch.num_warps


def test_a_bucket_is_tuned_once_and_its_winner_kept() -> None:
    launches = MoELaunches(MIXTRAL, max_tokens=8192)
    assert launches.launch(20) == table_launch(32, MIXTRAL)  # no timer: the table's
    timer = FakeTimer(best_m=64)
    launches.timer = timer
    tuned: list[str] = []
    launches.on_autotune = lambda name, seconds: tuned.append(name)
    winner = launches.launch(200)
    assert winner.block_m == 64 and winner.num_warps == 4  # the fastest candidate
    assert {n for _, n in timer.calls} == {200}
    assert [c for c, _ in timer.calls] == candidates(256, MIXTRAL, 8192)
    assert tuned == [f"fused_moe {MIXTRAL.key()} bucket<=256"]
    timer.calls.clear()
    assert launches.launch(33) == winner and launches.launch(20).block_m == 16
    assert timer.calls == [] and len(tuned) == 1  # tuned buckets are looked up, not timed
    # While a CUDA graph is captured nothing is timed (a sync would break the capture).
    launches.capturing = lambda: True
    assert launches.launch(3000) == table_launch(LAUNCH_TABLE[-1][0], MIXTRAL, 8192)
    assert timer.calls == [] and len(tuned) == 1


def test_an_autotune_after_ready_is_counted_exported_and_strict() -> None:
    from warmgate.server.runner.moe_tuning import _report

    monitor = JitMonitor()
    launches = MoELaunches(QWEN3_30B)
    launches.timer = FakeTimer()
    launches.on_autotune = lambda name, seconds: _report(monitor, name, seconds)
    launches.launch(1)  # before ready: the warmup's
    failures: list[str] = []
    monitor.add_listener(StrictJitPolicy("fail", failures.append))
    metrics = Metrics()
    monitor.add_listener(metrics.observe_jit)
    monitor.mark_ready()
    launches.launch(100)
    counts = monitor.snapshot()
    assert counts.compiles == {AUTOTUNE: 2} and counts.after_ready == {AUTOTUNE: 1}
    assert len(failures) == 1 and "bucket<=256" in failures[0]
    assert AUTOTUNE in COMPILE_KINDS
    assert metrics.registry.get_sample_value(
        "warmgate_jit_compiles_total", {"kind": AUTOTUNE, "after_ready": "true", "rank": "0"}) == 1


def test_shapes_the_kernel_cannot_take_name_their_field() -> None:
    def moe(**kw: int) -> ModelConfig:
        fields = dict(architecture="qwen3_moe", hidden_size=64, num_experts=8,
                      num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)
        return ModelConfig.from_preset("tiny", **{**fields, **kw})

    check_moe_kernel_shape(moe())
    check_moe_kernel_shape(ModelConfig.from_preset("qwen3-30b-a3b"))
    check_moe_kernel_shape(ModelConfig.from_preset("mixtral-8x7b"))
    for kw, field in [(dict(moe_intermediate_size=40), "model.moe_intermediate_size"),
                      (dict(num_experts=MAX_EXPERTS + 1), "model.num_experts")]:
        with pytest.raises(ConfigError) as info:
            check_moe_kernel_shape(moe(**kw))
        assert info.value.field_name == field and "\n" not in str(info.value)
        # The runner's MoE layer on CUDA refuses it before allocating anything.
        with pytest.raises(ConfigError, match=re.escape(field)):
            MoEBlock(moe(**kw), torch.device("cuda"), torch.bfloat16)
    # On the CPU the torch reference takes any shape.
    MoEBlock(moe(moe_intermediate_size=40), torch.device("cpu"), torch.float32)
    # The start-up check: on a CUDA device only.
    odd = RunnerConfig(model=moe(moe_intermediate_size=40))
    check_moe_kernel(odd)  # device "auto" or cpu: the reference runs
    with pytest.raises(ConfigError, match=r"model\.moe_intermediate_size"):
        check_moe_kernel(replace(odd, device=replace(odd.device, device="cuda")))


def test_the_cache_file_round_trip_and_what_it_refuses(tmp_path: Path) -> None:
    from warmgate.server.cache.moe_launches import MOE_FILE, load_moe_launches, save_moe_launches

    identity = {"gpu": "H200", "torch": "2.13"}
    saved = {32: (16, 64, 64, 4, 3), 256: (32, 128, 64, 8, 2)}
    save_moe_launches(tmp_path, identity, "e8k2", saved)
    assert load_moe_launches(tmp_path, identity, "e8k2", [32, 256]) == (saved, "")
    for args, why in [((identity, "e8k2", [32, 256, 2048]), "lacks the bucket <=2048"),
                      (({"gpu": "H100", "torch": "2.13"}, "e8k2", [32]), "was tuned on"),
                      ((identity, "e128k8", [32]), "was tuned for experts")]:
        found, reason = load_moe_launches(tmp_path, *args)
        assert found is None and why in reason
    (tmp_path / MOE_FILE).write_text(json.dumps({"version": 1, "identity": identity,
                                                 "shape": "e8k2", "launches": {"32": [1]}}))
    found, reason = load_moe_launches(tmp_path, identity, "e8k2", [32])
    assert found is None and "unreadable" in reason


def test_start_up_on_cuda_refuses_the_shape_in_one_line_naming_the_field(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The start-up's warmup checks (startup.check_can_warm_up) on a configuration resolved
    for CUDA, as on a GPU machine; the parser error they become is exit 2, one line."""
    import argparse

    from warmgate.server.config.runner_config import resolve_runner_config
    from warmgate.server.config.server_config import report_config_error
    from warmgate.server.startup import check_can_warm_up

    model = ModelConfig.from_preset("tiny", architecture="mixtral", num_experts=4,
                                    num_experts_per_tok=2, moe_intermediate_size=40,
                                    norm_topk_prob=True)
    base = RunnerConfig(model=model)
    runner = resolve_runner_config(replace(base, device=replace(base.device, device="cuda",
                                                                attention_backend="torch")),
                                   cuda_available=True)
    with pytest.raises(ConfigError) as info:
        check_can_warm_up(runner, None, {})
    assert info.value.field_name == "model.moe_intermediate_size"
    with pytest.raises(SystemExit) as exit_info:
        report_config_error(argparse.ArgumentParser(prog="warmgate-server"), info.value)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "model.moe_intermediate_size: 40 is not a multiple of 16" in err[-1]
