"""--deterministic attention above the kernel: the split size and the programs a decode runs
(kernels/fixed_split_plan.py), the triton backend's routing (every batch runs the fixed-split
kernel; small uniform decodes run the splits apart and merge, the same bits), binaries that
do not specialise on batch-varying ints, the warmup running both ways before ready, and the
determinism phase with the keys cut every 16 positions so its probes cross split boundaries.

On a machine with CUDA the interpreter is not forced and the same checks run on the GPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from triton.runtime.interpreter import InterpretedFunction

from tests.kernel_device import kernel_device
from tests.paged_reference import make_paged_batch
from tests.runner_helpers import tiny_config
from tests.test_deterministic_triton import uniform_decodes_use_the_fixed_split_kernel
from tests.test_triton_kernels import _meta
from warmgate.server.core.results import PhaseStatus
from warmgate.server.kernels import fixed_split_attention
from warmgate.server.kernels.fixed_split_attention import (
    _fixed_split_kernel,
    _fold_partials_kernel,
    key_tile,
    paged_attention_fixed_split,
)
from warmgate.server.kernels.fixed_split_plan import (
    MAX_SPLITS,
    MAX_WORKSPACE_BYTES,
    MIN_SPLIT_TILES,
    PROGRAMS_PER_SM,
    FixedSplitPlan,
    fixed_split_plan,
)
from warmgate.server.kernels.invariant_ops import BatchInvariantOps
from warmgate.server.kernels.varlen_attention import _varlen_kernel
from warmgate.server.runner.attention import AttentionSpec, triton_backend
from warmgate.server.runner.attention.triton_backend import TritonAttentionBackend
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.warmup.determinism import run_determinism_check
from warmgate.server.warmup.kernels import warmup_forward_kernels

DEVICE = kernel_device(_fixed_split_kernel)


def test_the_split_size_is_a_function_of_the_capacity_and_the_key_tile() -> None:
    assert fixed_split_plan(2048, 64) == FixedSplitPlan(split_keys=256, max_splits=8)
    assert fixed_split_plan(16384, 64) == FixedSplitPlan(split_keys=256, max_splits=64)
    assert fixed_split_plan(131072, 64) == FixedSplitPlan(split_keys=2048, max_splits=64)
    assert fixed_split_plan(128, 16) == FixedSplitPlan(split_keys=64, max_splits=2)
    for capacity in range(1, 70000, 997):
        for tile in (16, 32, 64):
            plan = fixed_split_plan(capacity, tile)
            assert plan.split_keys % tile == 0 and plan.split_keys >= MIN_SPLIT_TILES * tile
            assert 1 <= plan.max_splits <= MAX_SPLITS
            assert (plan.max_splits - 1) * plan.split_keys < capacity  # no split wholly past
    with pytest.raises(ValueError, match="capacity 0"):
        fixed_split_plan(0, 64)


def test_a_launch_splits_apart_only_while_its_grid_leaves_sms_idle() -> None:
    plan = FixedSplitPlan(split_keys=256, max_splits=16)
    counts = [plan.programs(n, 132, 4096) for n in range(1, 600)]
    assert counts[0] == 16 and counts == sorted(counts, reverse=True)  # fewer as grids grow
    assert plan.programs(PROGRAMS_PER_SM * 132, 132, 4096) == 1  # a full grid: one program
    assert plan.programs(8, 132, 4096) == 16 and plan.programs(40, 132, 4096) == 7
    assert FixedSplitPlan(split_keys=64, max_splits=1).programs(1, 132, 4096) == 1
    # Two programs would share the splits (a grid of 132-263): walked in one instead.
    assert plan.programs(132, 132, 4096) == 1 and plan.programs(131, 132, 4096) == 3
    assert FixedSplitPlan(split_keys=256, max_splits=2).programs(1, 132, 4096) == 1
    # A workspace past the bound: walked in one program, however small the grid.
    assert plan.programs(1, 132, MAX_WORKSPACE_BYTES // 16) == 16
    assert plan.programs(1, 132, MAX_WORKSPACE_BYTES // 16 + 1) == 1


def test_batch_varying_ints_are_never_specialised_on() -> None:
    # An int the compiler specialises on (== 1, % 16) would compile another binary for another
    # batch after ready: num_tokens follows T, num_reqs the batch, the other two the
    # decode's batch size. The varlen kernel's num_reqs too.
    def unspecialised(kernel: object) -> set[str]:
        names = (kernel.kwargs.get("do_not_specialize", []) if isinstance(  # type: ignore[attr-defined]
            kernel, InterpretedFunction) else kernel.do_not_specialize)  # type: ignore[attr-defined]
        return set(names)

    assert unspecialised(_fixed_split_kernel) >= {"num_tokens", "num_reqs", "split_programs",
                                                   "write_partials"}
    assert unspecialised(_fold_partials_kernel) >= {"num_tokens", "num_reqs"}
    assert unspecialised(_varlen_kernel) >= {"num_reqs"}


TILE = key_tile(16, torch.float32, DEVICE == "cuda")
SPLIT_KEYS = MIN_SPLIT_TILES * TILE  # the plan's C for the small capacity below
TABLE_WIDTH = (3 * SPLIT_KEYS + 16) // 4  # blocks of 4 keys: room for 3 splits and a bit


def test_the_backend_runs_small_batches_apart_with_the_same_bits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = AttentionSpec(num_heads=8, num_kv_heads=2, head_dim=16, block_size=4, num_blocks=256,
                         max_blocks_per_req=TABLE_WIDTH, max_num_reqs=4, max_num_tokens=512,
                         dtype=torch.float32, device=torch.device(DEVICE), deterministic=True)
    assert fixed_split_plan(TABLE_WIDTH * 4, TILE).split_keys == SPLIT_KEYS
    backend = TritonAttentionBackend(spec)
    assert backend.split_programs(1, 1) > 1 and backend.split_programs(3, 12) > 1
    assert backend.split_programs(1000, 1000) == 1  # a grid that already fills 132 SMs
    assert backend.split_programs(1, 1 << 20) == 1  # a workspace past the bound
    seen: list[int] = []

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        seen.append(kwargs["split_programs"])  # type: ignore[arg-type]
        return paged_attention_fixed_split(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(triton_backend, "paged_attention_fixed_split", spy)
    c = SPLIT_KEYS
    for q_lens, context_lens, uniform in (([4, 4, 4], [3, 2 * c + 2, c + 6], True),
                                          ([1, 6, 2], [2 * c + 12, 0, 8], False)):
        # The longest request's keys cross two split boundaries.
        longest = max(n + q for n, q in zip(context_lens, q_lens, strict=True))
        batch = make_paged_batch(50, q_lens, context_lens, 8, 2, 16, 4, torch.float32,
                                 DEVICE, extra_table_cols=TABLE_WIDTH - -(-longest // 4))
        out = backend.forward(0, batch.q, batch.k_new, batch.v_new, batch.kv_cache,
                              _meta(batch, uniform))
        walked = paged_attention_fixed_split(
            batch.q, batch.kv_cache, batch.block_table, batch.seq_lens, batch.query_start_loc,
            scale=spec.scale, max_query_len=max(q_lens), split_keys=c)
        assert torch.equal(out, walked)  # walked in one program: the same bits
    # Apart for the verification and for the small mixed batch.
    assert seen == [backend.split_programs(3, 12), backend.split_programs(3, 9)]
    assert min(seen) > 1


# Sized for the interpreter's 16-key tiles: at the GPU's 64-key tiles tiny's short sequences
# hold one split and the real SM count never runs them apart, so both ways never meet there;
# tests/gpu/test_deterministic_gpu.py cuts the keys at every GPU tile instead.
INTERPRETER_SIZED = pytest.mark.skipif(torch.cuda.is_available(),
                                       reason="sized for the interpreter's key tiles")


def _deterministic_runner(k: int) -> ModelRunner:
    # One layer: a second would run the same attention launches on the same batches.
    c = tiny_config(attention_backend="triton", num_spec=k, device=DEVICE, num_layers=1)
    c = dataclasses.replace(c, numerics=dataclasses.replace(c.numerics, deterministic=True))
    return ModelRunner(c, ops=BatchInvariantOps())  # type: ignore[arg-type]


def _record_ways(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(split_programs, longest seq_len) of every fixed-split launch from now on."""
    seen: list[tuple[int, int]] = []
    real = fixed_split_attention.paged_attention_fixed_split

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        seq_lens = args[3]
        assert isinstance(seq_lens, torch.Tensor)
        seen.append((int(kwargs["split_programs"]), int(seq_lens.max())))  # type: ignore[call-overload]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(triton_backend, "paged_attention_fixed_split", spy)
    return seen


@pytest.mark.slow
@INTERPRETER_SIZED
def test_the_warmup_runs_the_merge_before_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    # One binary of the kernel serves both ways (the way is a runtime argument); the merge
    # kernel is another, compiled only where a split-apart launch runs. The plan's program
    # count never grows with the batch, and the warmup decodes one request alone, so if any
    # batch runs apart in serving, the warmup ran the merge first. One key tile a split: enough
    # splits that a lone decode shares them among MIN_APART_PROGRAMS programs or more.
    monkeypatch.setattr(triton_backend, "fixed_split_plan",
                        lambda capacity, tile: FixedSplitPlan(tile, -(-capacity // tile)))
    runner = _deterministic_runner(3)
    seen = _record_ways(monkeypatch)
    result = warmup_forward_kernels(runner, runner.execute_model, runner.sample_tokens)
    assert result.ran
    assert any(programs > 1 for programs, _ in seen), seen


@pytest.mark.slow
@INTERPRETER_SIZED
@pytest.mark.parametrize("k", [0, 3])
def test_the_determinism_phase_passes_with_a_split_every_key_tile(
        monkeypatch: pytest.MonkeyPatch, k: int) -> None:
    # One tile a split (16 keys under the interpreter): the probes' 13-token prompts and
    # their companions' cross split boundaries in prefills and decodes. Four SMs: the probe
    # alone runs its splits apart, inside the mixed batch walks them in one program.
    tiles: list[int] = []

    def one_tile_splits(capacity: int, tile: int) -> FixedSplitPlan:
        tiles.append(tile)
        return FixedSplitPlan(tile, -(-capacity // tile))

    monkeypatch.setattr(triton_backend, "fixed_split_plan", one_tile_splits)
    monkeypatch.setattr(triton_backend, "device_sm_count", lambda device: 4)
    runner = _deterministic_runner(k)
    seen = _record_ways(monkeypatch)
    uniform = uniform_decodes_use_the_fixed_split_kernel(monkeypatch, runner)
    phase = run_determinism_check(runner, runner.execute_model, runner.sample_tokens)
    assert phase.status is PhaseStatus.RAN, phase.detail
    # Both ways ran over sequences of two splits and more.
    assert {programs > 1 for programs, longest in seen if longest > tiles[0]} == {False, True}
    # None ran on the split decode kernel; without drafts the probes' decodes are uniform
    # ones (with drafts they are verifications).
    assert any(uniform) or k > 0
